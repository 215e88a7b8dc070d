"""`make bench` = `python -m tests.bench`: runs every tests/bench/bench_*.py module's main() in turn."""
import importlib
import pkgutil
import sys

import tests.bench as pkg

names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name.startswith("bench_"))
for name in names:
    print(f"# {name}", file=sys.stderr, flush=True)
    sys.argv = [name]
    importlib.import_module(f"tests.bench.{name}").main()
