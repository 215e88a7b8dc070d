"""`make bench` = `python -m tests.bench`: runs every tests/bench/bench_*.py module's main() in turn; exits
non-zero when any of them returned non-zero (bench_fast: a goal of tests/bench/goals.py missed), after all ran."""
import importlib
import pkgutil
import sys

import tests.bench as pkg

names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_"))
failed = []
for name in names:
    print(f"# {name}", file=sys.stderr, flush=True)
    sys.argv = [name]
    if importlib.import_module(f"tests.bench.{name}").main():
        failed.append(name)
if failed:
    print(f"make bench: FAILED: {', '.join(failed)} (see above)", file=sys.stderr)
    sys.exit(1)
