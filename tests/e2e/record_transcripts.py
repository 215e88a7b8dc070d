"""Record byte transcripts of llama-server's answers into tests/data/llamacpp/ (run once; replayed by
tests/unit/test_llamacpp_transcripts.py and compared with the simulator's --emulate llamacpp surface).

    LLAMA_SERVER=... LLAMA_MODEL=... python -m tests.e2e.record_transcripts   (or: make record-llamacpp)

Each exchange is one JSON file NAME.json: {"request": the request bytes, "reads": the response bytes as
the socket returned them, one string per recv, until the server closed the connection}, bytes stored as
latin-1 strings (lossless). Requests use `Connection: close` so a response ends with the connection.
"""
from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import orjson

from tests.e2e.llama_server import LlamaServer

OUT = Path(__file__).resolve().parents[1] / "data" / "llamacpp"
TEXT = "kalo mine rusa tevo"
MESSAGES = [{"role": "user", "content": TEXT}]
OPTS = {"max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
        "cache_prompt": False, "temperature": 0}
EXCHANGES: dict[str, tuple[str, str, dict | None]] = {
    "tokenize_content": ("POST", "/tokenize", {"content": TEXT, "add_special": False}),
    "tokenize_content_special": ("POST", "/tokenize", {"content": TEXT, "add_special": True}),
    "tokenize_vllm_shape": ("POST", "/tokenize", {"model": "tiny-llama", "prompt": TEXT, "add_special_tokens": False}),
    "tokenize_vllm_chat_shape": ("POST", "/tokenize", {"model": "tiny-llama", "messages": MESSAGES}),
    "tokenize_tgi_shape": ("POST", "/tokenize", {"inputs": TEXT}),
    "apply_template": ("POST", "/apply-template", {"messages": MESSAGES}),
    "completions_stream": ("POST", "/v1/completions", {"model": "tiny-llama", "prompt": TEXT, **OPTS}),
    "chat_stream": ("POST", "/v1/chat/completions", {"model": "tiny-llama", "messages": MESSAGES, **OPTS}),
    "completion_native_stream": ("POST", "/completion", {"prompt": TEXT, "n_predict": 4, "stream": True,
                                                          "ignore_eos": True, "cache_prompt": False}),
    "get_v1_models": ("GET", "/v1/models", None),
    "get_props": ("GET", "/props", None),
    "get_version": ("GET", "/version", None),
    "get_info": ("GET", "/info", None),
    "get_api_version": ("GET", "/api/version", None),
    "get_get_server_info": ("GET", "/get_server_info", None),
    "get_metrics": ("GET", "/metrics", None),
}


def exchange(port: int, method: str, path: str, body: dict | None) -> tuple[bytes, list[bytes]]:
    data = orjson.dumps(body) if body is not None else b""
    req = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
           + (f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n" if body is not None else "")
           + "\r\n").encode() + data
    reads = []
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(req)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            reads.append(chunk)
    return req, reads


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        srv = LlamaServer(Path(tmp) / "llama-server.log", slots=1, ctx=2048)
        srv.start()
        try:
            for name, (method, path, body) in EXCHANGES.items():
                req, reads = exchange(srv.port, method, path, body)
                doc = {"request": req.decode("latin-1"), "reads": [r.decode("latin-1") for r in reads]}
                (OUT / f"{name}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
                print(f"{name}: {sum(map(len, reads))} bytes in {len(reads)} reads")
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
