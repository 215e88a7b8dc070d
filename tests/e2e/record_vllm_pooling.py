"""Record byte transcripts of vLLM's pooling APIs into tests/data/vllm/ (run once; replayed by
tests/unit/test_pooled_backends.py): `/v1/embeddings` (float and base64 vectors) and `/v1/rerank`, answered by
the CPU build's tiny random Llama served as an embedding model (`--runner pooling --convert embed`:
tests/e2e/vllm_server.py POOLING_FLAGS; vLLM 0.32 then scores rerank requests by embedding similarity).

    eval "$(tests/e2e/build_vllm.sh)" && python -m tests.e2e.record_vllm_pooling   (or VLLM_URL=... of such a server)

The files have the shape of the event-stream transcripts (tests/e2e/record_vllm_transcripts.py: the request
bytes and the response bytes as the socket returned them, one string per recv, latin-1), plus `tokenize`:
what vLLM's /tokenize counts for each text sent, as a raw prompt (special tokens included), in order.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import orjson

from tests.e2e.record_transcripts import exchange
from tests.e2e.vllm_server import MODEL_NAME, POOLING_FLAGS, VllmServer

OUT = Path(__file__).resolve().parents[1] / "data" / "vllm"
TEXT, QUERY, DOCUMENTS = "kalo mine rusa tevo", "kalo mine", ["rusa tevo", "zupe diha jifu"]
EXCHANGES = {
    "embeddings_float": ("/v1/embeddings", {"model": MODEL_NAME, "input": TEXT}, [TEXT]),
    "embeddings_base64": ("/v1/embeddings", {"model": MODEL_NAME, "input": TEXT, "encoding_format": "base64"},
                          [TEXT]),
    "rerank": ("/v1/rerank", {"model": MODEL_NAME, "query": QUERY, "documents": DOCUMENTS}, [QUERY, *DOCUMENTS]),
}


def record(port: int) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, (path, body, texts) in EXCHANGES.items():
        counts = []
        for text in texts:
            _, reads = exchange(port, "POST", "/tokenize", {"model": MODEL_NAME, "prompt": text})
            counts.append(orjson.loads(b"".join(reads).partition(b"\r\n\r\n")[2])["count"])
        req, reads = exchange(port, "POST", path, body)
        doc = {"request": req.decode("latin-1"), "reads": [r.decode("latin-1") for r in reads], "tokenize": counts}
        (OUT / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        print(f"{name}: {sum(map(len, reads))} bytes in {len(reads)} reads")


def main() -> None:
    if os.environ.get("VLLM_URL"):
        record(int(os.environ["VLLM_URL"].rstrip("/").rsplit(":", 1)[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        srv = VllmServer(Path(tmp) / "vllm.log", extra=POOLING_FLAGS)
        srv.start()
        try:
            record(srv.port)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
