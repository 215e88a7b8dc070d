"""`make bench`: the twin against llama-server (docs/twin.md): fit, predict the mixed workload with intervals
at 3 rates and measure it twice, print the coverage table, write tests/bench/twin.json. ~10 min; needs the e2e build
(tests/e2e/build_llama_server.sh: cached, or ~12 min cold); says so and skips when it cannot build."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    if not (os.environ.get("LLAMA_SERVER") and os.environ.get("LLAMA_MODEL")):
        p = subprocess.run(["bash", str(ROOT / "tests/e2e/build_llama_server.sh")], capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable})
        if p.returncode != 0:
            print(f"bench_twin: SKIPPED, no llama-server: {p.stderr[-500:]}")
            return
        for line in p.stdout.splitlines():
            k, _, v = line.partition("=")
            if k in ("LLAMA_SERVER", "LLAMA_MODEL"):
                os.environ[k] = v
    from tests.e2e.llama_server import LlamaServer
    from tests.e2e.twin_validation import table, validate

    with tempfile.TemporaryDirectory() as d:
        srv = LlamaServer(Path(d) / "llama-server.log", slots=2)
        srv.start()
        try:
            v = validate(srv.url, srv.proc.pid, Path(d))
        finally:
            srv.stop()
    print(table(v))
    (ROOT / "tests/bench/twin.json").write_bytes(orjson.dumps(v, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
