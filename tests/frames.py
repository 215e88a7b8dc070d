"""Synthetic results for analysis tests: requests/tokens frames built from a few numbers per request."""
from __future__ import annotations

import polars as pl

from loadgen.results.folder import REQUEST_SCHEMA, TOKEN_SCHEMA, Run

MS = 1_000_000


def make_run(reqs: list[dict], manifest: dict | None = None) -> Run:
    """Each dict: id, intended (ms), ttft (ms from dispatch), token times (list of ms, absolute from t0),
    optional prompt, server_* ms, connect (ms), lag (ms), answer (ms from t0: the first answer token;
    default the first token, no reasoning). Everything else gets a sane default."""
    rows, toks = [], []
    for i, r in enumerate(reqs):
        t = [round(x * MS) for x in r["tokens"]]
        intended = round(r.get("intended", 0) * MS)
        dispatched = intended + round(r.get("lag", 0) * MS)
        row = {k: None for k in REQUEST_SCHEMA}
        row.update(request_id=r["id"], idx=i, worker=0, warmup=False, intended_ns=intended,
                   dispatched_ns=dispatched, connected_ns=dispatched + round(r.get("connect", 0) * MS),
                   sent_ns=dispatched, response_ns=dispatched, first_token_ns=t[0], last_token_ns=t[-1],
                   done_ns=t[-1], outcome=r.get("outcome", "ok"), planned_prompt_tokens=r.get("prompt", 100),
                   prompt_tokens=r.get("prompt", 100), max_tokens=len(t), output_tokens=len(t), n_chunks=len(t),
                   server_queue_ms=r.get("server_queue"), server_prefill_ms=r.get("server_prefill"),
                   server_decode_ms=r.get("server_decode"),
                   first_answer_ns=round(r["answer"] * MS) if "answer" in r else t[0], reasoning_tokens=0)
        rows.append(row)
        toks += [{"request_id": r["id"], "idx": j, "t_ns": x, "n_tokens": 1} for j, x in enumerate(t)]
    return Run(path=None, manifest=manifest or {"status": "complete"},
               requests=pl.DataFrame(rows, schema=REQUEST_SCHEMA, orient="row"),
               tokens=pl.DataFrame(toks, schema=TOKEN_SCHEMA, orient="row"))


def stream(first_ms: float, n: int, itl_ms: float, extra: dict[int, float] | None = None) -> list[float]:
    """n token times: the first at first_ms, then every itl_ms; extra {i: ms} lengthens gap i (before token i)."""
    out, t = [first_ms], first_ms
    for i in range(1, n):
        t += itl_ms + (extra or {}).get(i, 0.0)
        out.append(t)
    return out
