"""Recorded byte transcripts of real servers (tests/data/<server>/NAME.json, written by
tests/e2e/record_transcripts.py): the request bytes and the response bytes as the socket returned them."""
from __future__ import annotations

from pathlib import Path

import orjson

from loadgen.client.rawhttp import parse_response

DATA = Path(__file__).resolve().parent / "data"


class Transcript:
    def __init__(self, server: str, name: str):
        self.doc = doc = orjson.loads((DATA / server / f"{name}.json").read_bytes())
        self.request = doc["request"].encode("latin-1")
        self.reads = [r.encode("latin-1") for r in doc["reads"]]
        parsed = parse_response(self.reads, closed=True)
        assert parsed is not None and parsed.complete, name
        self.status = parsed.status
        self.body_reads = [b for b in parsed.body_reads if b]
        self.body = b"".join(self.body_reads)
        head = b"".join(self.reads)[:parsed.header_end].decode("latin-1").split("\r\n")[1:]
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head if h)}
        req_head, _, self.request_body = self.request.partition(b"\r\n\r\n")
        self.method, self.path = req_head.split(b" ")[:2]
        self.method, self.path = self.method.decode(), self.path.decode()

    def json(self):
        return orjson.loads(self.body)

    def events(self) -> list:
        """The SSE data payloads (JSON objects, or b"[DONE]")."""
        out = []
        for block in self.body.split(b"\n\n"):
            if block.startswith(b"data: "):
                data = block[6:]
                out.append(data if data == b"[DONE]" else orjson.loads(data))
        return out


def names(server: str) -> list[str]:
    return sorted(p.stem for p in (DATA / server).glob("*.json"))
