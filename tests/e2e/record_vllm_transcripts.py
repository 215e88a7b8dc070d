"""Record byte transcripts of vLLM's event-stream APIs into tests/data/vllm/ (run once; replayed by
tests/unit/test_event_stream_transcripts.py): OpenAI's `/v1/responses` and Anthropic's `/v1/messages`, both
streamed, on the CPU build's tiny random Llama (tests/e2e/build_vllm.sh).

    eval "$(tests/e2e/build_vllm.sh)" && python -m tests.e2e.record_vllm_transcripts   (or VLLM_URL=...)

The files have the shape of tests/data/llamacpp/ (tests/e2e/record_transcripts.py: the request bytes and the
response bytes as the socket returned them, one string per recv, latin-1), plus `tokenize`: what vLLM's
/tokenize counts for the same messages through the chat template (the chat-completions count).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orjson

from tests.e2e.record_transcripts import exchange
from tests.e2e.vllm_server import MODEL_NAME, VllmServer

OUT = Path(__file__).resolve().parents[1] / "data" / "vllm"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "kalo mine rusa tevo"},
            {"role": "assistant", "content": "yes"}, {"role": "user", "content": "more"}]
MAX_TOKENS = 8
EXCHANGES = {
    "responses_stream": ("/v1/responses", {"model": MODEL_NAME, "input": MESSAGES, "max_output_tokens": MAX_TOKENS,
                                           "stream": True, "store": False, "ignore_eos": True}),
    "messages_stream": ("/v1/messages", {"model": MODEL_NAME, "system": MESSAGES[0]["content"],
                                         "messages": MESSAGES[1:], "max_tokens": MAX_TOKENS, "stream": True,
                                         "ignore_eos": True}),
}


def record(port: int) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    _, reads = exchange(port, "POST", "/tokenize", {"model": MODEL_NAME, "messages": MESSAGES,
                                                    "add_generation_prompt": True})
    tokenize = orjson.loads(b"".join(reads).partition(b"\r\n\r\n")[2])["count"]
    for name, (path, body) in EXCHANGES.items():
        req, reads = exchange(port, "POST", path, body)
        doc = {"request": req.decode("latin-1"), "reads": [r.decode("latin-1") for r in reads],
               "tokenize": tokenize}
        (OUT / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        print(f"{name}: {sum(map(len, reads))} bytes in {len(reads)} reads")


def main() -> None:
    if os.environ.get("VLLM_URL"):
        record(int(os.environ["VLLM_URL"].rstrip("/").rsplit(":", 1)[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        srv = VllmServer(Path(tmp) / "vllm.log")
        srv.start()
        try:
            record(srv.port)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
