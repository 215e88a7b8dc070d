"""Record byte transcripts of vLLM 0.32 streaming reasoning into tests/data/vllm/ (run once; replayed by
tests/unit/test_vllm_reasoning_transcripts.py): one streamed chat request to the tiny think model
(VLLM_THINK_MODEL) under `--reasoning-parser qwen3` and under `--reasoning-parser deepseek_r1`, one server at
a time, with the e2e test's logit_bias (tests/e2e/test_vllm_reasoning.py: +8 on `</think>`, -100 on the
tokens that stream no text) and a request seed, tried until the reply has both phases.

    eval "$(tests/e2e/build_vllm.sh)" && VLLM_THINK_MODEL=$VLLM_THINK_MODEL python -m tests.e2e.record_vllm_reasoning

The files have the shape of record_vllm_transcripts.py's (request bytes, response bytes one string per recv,
latin-1), plus `parser` and `seed`.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orjson

from tests.e2e.record_transcripts import exchange
from tests.e2e.test_vllm_reasoning import bias
from tests.e2e.vllm_server import MODEL_NAME, VllmServer

OUT = Path(__file__).resolve().parents[1] / "data" / "vllm"
PARSERS = ("qwen3", "deepseek_r1")
MAX_TOKENS = 12


def deltas(reads: list[bytes]) -> list[dict]:
    body = b"".join(reads).partition(b"\r\n\r\n")[2]
    out = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            out.extend(c["delta"] for c in orjson.loads(line[6:]).get("choices", ()))
    return out


def record(port: int, parser: str, logit_bias: dict[str, int]) -> None:
    for seed in range(1, 50):
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hello world"}],
                "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True},
                "ignore_eos": True, "seed": seed, "logit_bias": logit_bias}
        req, reads = exchange(port, "POST", "/v1/chat/completions", body)
        ds = deltas(reads)
        r, a = sum(bool(d.get("reasoning")) for d in ds), sum(bool(d.get("content")) for d in ds)
        if r >= 2 and a >= 2:
            doc = {"request": req.decode("latin-1"), "reads": [x.decode("latin-1") for x in reads],
                   "parser": parser, "seed": seed}
            name = f"chat_reasoning_{parser}"
            (OUT / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
            print(f"{name}: seed {seed}, {r} reasoning and {a} content deltas, {len(reads)} reads")
            return
    raise SystemExit(f"{parser}: no seed in 1..49 gave a reply with both phases")


def main() -> None:
    model = os.environ["VLLM_THINK_MODEL"]
    _, logit_bias = bias(model)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for parser in PARSERS:   # one vLLM at a time
            srv = VllmServer(Path(tmp) / f"vllm-{parser}.log", model=model, extra=("--reasoning-parser", parser))
            srv.start()
            try:
                record(srv.port, parser, logit_bias)
            finally:
                srv.stop()


if __name__ == "__main__":
    main()
