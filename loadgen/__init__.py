"""loadgen: an open-loop load generator and benchmark harness for LLM inference servers."""

__version__ = "0.1.0"
