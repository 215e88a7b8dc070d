# The names loadgen/__init__.py loads on first use (from loadgen/api.py), for the type checker.
from loadgen.api import compare as compare, read as read, run as run, sweep as sweep

__version__: str
__all__: list[str]
