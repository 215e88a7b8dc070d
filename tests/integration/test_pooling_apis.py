"""The pooling APIs (`api = "embeddings"`, `api = "rerank"`) end to end: `loadgen run` against the simulator's
/v1/embeddings and /v1/rerank, every row checked against the simulator's truth (sim_truth.parquet, the same
monotonic clock): each answer's e2e stamp after the server had it ready and within the host's loop lateness
of it, prompt tokens = the truth's = the plan's, no token (no TTFT/ITL), the prefill charged by the engine's
step model and nothing decoded (the server's own counters), the summary and report complete, valid and
without TTFT/ITL figures; faults typed, and a server's bad 200 answers (an error object, cut or shapeless
JSON) typed rows; nonsensical options refused before anything is sent."""
import base64
import struct
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import polars as pl
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from loadgen.sim.profiles import load_profile
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen, report_json, workload
from tests.integration.test_reasoning_tools import delivered_in_time

RERANK = """
[rerank]
documents = { dist = "uniform", min = 2, max = 5 }
document_tokens = { dist = "uniform", min = 8, max = 40 }
"""
NO_STREAM_METRICS = ("ttft", "ttfa", "ttft_from_send", "itl", "tpot")


def pooling_workload(tmp_path, api: str, requests: int) -> str:
    text = open(workload(tmp_path, api=api, rate="10/s", requests=requests)).read()
    text = text.replace("[output]\ntokens = 32\n", "")   # nothing is generated: no output length
    assert "[output]" not in text
    path = tmp_path / "pooling.toml"
    path.write_text(text + (RERANK if api == "rerank" else ""))
    return str(path)


def run(tmp_path, api: str, *flags: str, requests: int = 24, code: int = 0):
    out = tmp_path / "run"
    p = loadgen("run", pooling_workload(tmp_path, api, requests), "--out", str(out), "--quiet", *RELAXED_SELFCHECK,
                *flags)
    assert p.returncode == code, p.stderr
    assert "Traceback" not in p.stderr
    r = read_run(out)
    truth = pl.read_parquet(out / "sim_truth.parquet")
    rows = r.requests.join(truth.select("request_id", "endpoint", "fault", "token_ns", "lateness_ns", "scheduled_ns",
                                        *(pl.col(c).alias(f"truth_{c}") for c in (
                                            "outcome", "prompt_tokens", "output_tokens", "first_token_ns",
                                            "finish_ns", "queue_ns", "prefill_ns"))), on="request_id")
    assert rows.height == requests == r.requests.height   # no calibration probes: these runs are never calibrated
    assert (rows["endpoint"] == api).all()
    return out, r, rows


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_rows_against_the_truth(tmp_path, api):
    out, r, rows = run(tmp_path, api, "--scrape-metrics")
    assert (rows["outcome"] == "ok").all() and (rows["truth_outcome"] == "ok").all()
    # tokens: the server's usage = the truth = the plan (rerank: documents x query + the documents' tokens)
    assert (rows["prompt_tokens"] == rows["truth_prompt_tokens"]).all()
    assert (rows["prompt_tokens"] == rows["planned_prompt_tokens"]).all()
    assert (rows["truth_output_tokens"] == 0).all() and (rows["token_ns"].list.len() == 0).all()
    assert (rows["output_tokens"] == 0).all() and (rows["n_chunks"] == 0).all() and (rows["max_tokens"] == 0).all()
    assert rows["first_token_ns"].is_null().all() and rows["first_answer_ns"].is_null().all()
    assert r.tokens.height == 0
    if api == "rerank":   # the documents made the prompt: more than the query alone, by a varying count
        assert (rows["planned_prompt_tokens"] > 40).all() and rows["planned_prompt_tokens"].n_unique() > 5
    # e2e: the client's stamp of the answer follows the moment the server had it ready, by the host's lateness
    t0 = r.manifest["t0"]["monotonic_ns"]
    delivered_in_time(r, (rows["last_token_ns"] + t0 - rows["truth_finish_ns"]).to_list())
    # the truth: queue + prefill + the answer's write, nothing decoded
    prof = load_profile("tiny")
    isolated = 0
    spans = sorted(zip(rows["scheduled_ns"], rows["truth_first_token_ns"]))
    for row in rows.iter_rows(named=True):
        assert row["truth_prefill_ns"] > 0 and row["truth_queue_ns"] >= 0
        # a request prefilled alone (no other one's prefill overlapped its step) took exactly the profile's
        # step time for its prompt: its due time minus its step's start
        start, ready = row["scheduled_ns"], row["truth_first_token_ns"]
        if sum(1 for a, b in spans if a < ready and b > start) == 1:
            p = row["truth_prompt_tokens"]
            due = ready - row["lateness_ns"][0]
            assert due - start == round(prof.step_ns(p, 1, p, p * (p + 1) // 2, True)), row
            isolated += 1
    assert isolated >= len(rows) // 2
    # the server's counters over the run: every prompt token prefilled, no token generated
    m = r.server_metrics()
    last = m.filter(pl.col("t_ns") == m["t_ns"].max())
    value = dict(zip(last["name"], last["value"]))
    assert value["vllm:generation_tokens_total"] == 0
    assert value["vllm:prompt_tokens_total"] == rows["truth_prompt_tokens"].sum()
    # the summary: complete and valid, e2e only, prompt tokens per second
    s = report_json(str(out))
    assert s["valid"] is True and s["run"]["status"] == "complete" and s["invalid_reasons"] == []
    assert s["requests"]["ok"] == len(rows) and s["requests"]["failed"] == 0
    lat = s["latency_ms"]
    for metric in NO_STREAM_METRICS:
        assert all(v is None for v in lat[metric].values()), (metric, lat[metric])
    e2e_ms = sorted(((rows["last_token_ns"] - rows["intended_ns"]) / 1e6).to_list())
    assert lat["e2e"]["max"] == pytest.approx(e2e_ms[-1]) and lat["e2e"]["p50"] == pytest.approx(e2e_ms[11])
    assert s["histograms"]["e2e"]["count"] == len(rows) and s["histograms"]["ttft"]["count"] == 0
    thr = s["throughput"]
    assert thr["output_tokens_per_s"] == 0
    assert thr["prompt_tokens_per_s"] == pytest.approx(thr["requests_per_s"] * rows["prompt_tokens"].mean())
    assert s["prompt_lengths"]["exact"] is True
    assert r.manifest["calibration"].startswith("off: a pooling API")
    text = loadgen("report", str(out))
    assert text.returncode == 0 and "prompt tok/s" in text.stdout
    lines = text.stdout.splitlines()
    # the metrics that have no sample are named once, not drawn as rows of dashes; e2e is a row
    assert not any(line.startswith(("ttft ", "itl ", "tpot ")) for line in lines), text.stdout
    assert "no samples: ttft, ttfa, ttft_from_send, itl, tpot" in lines
    assert any(line.startswith("e2e ") and "-" not in line.split()[1:] for line in lines)
    assert "decomposition: no ok request with a first token to split into queue, prefill and decode" in lines
    html = loadgen("report", str(out), "--format", "html", "--out", str(tmp_path / "r.html"))
    assert html.returncode == 0, html.stderr
    md = loadgen("report", str(out), "--format", "md", "--out", str(tmp_path / "r.md"))
    assert md.returncode == 0, md.stderr
    for page in (tmp_path / "r.html", tmp_path / "r.md"):   # the same rule in the pages' tables
        shown = page.read_text()
        assert "no samples: ttft, ttfa, ttft_from_send, itl, tpot" in shown
        assert "nothing to split into queue, prefill and decode" in shown and "decode_contention" not in shown
        assert "| ttft |" not in shown and "<td>ttft</td>" not in shown
    assert "ttft p50" not in (tmp_path / "r.html").read_text()   # nor a line of it over time


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_fixed_mode_answers_at_its_ttft(tmp_path, api):
    # fixed mode: each answer is ready TTFT after arrival, so every e2e is at least that
    out, r, rows = run(tmp_path, api, "--sim-args", "--mode fixed --ttft 30ms", requests=12)
    assert (rows["outcome"] == "ok").all()
    assert ((rows["truth_first_token_ns"] - rows["scheduled_ns"]) >= 30_000_000).all()
    assert report_json(str(out))["latency_ms"]["e2e"]["p50"] >= 30


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_faults_are_typed(tmp_path, api):
    # malformed: the JSON answer cut in half; reset_after: the connection reset before the answer; http500
    out, r, rows = run(tmp_path, api, "--sim-args", "--mode fixed --ttft 5ms --seed 5 "
                       "--faults malformed=0.25,reset_after=1:0.25,http500=0.25", code=3)
    kinds = {"": ("ok", None), "malformed": ("stream_error", "malformed_chunk"),
             "reset_after=1": ("connection_error", "reset"), "http500": ("http_error", "http_500")}
    for row in rows.iter_rows(named=True):
        assert (row["outcome"], row["error_kind"]) == kinds[row["fault"]], row
        if row["fault"] == "malformed":
            assert "answer is not JSON" in row["error_detail"]
        if row["outcome"] != "ok":
            assert row["last_token_ns"] is None
    assert set(rows["fault"]) == set(kinds), rows["fault"].value_counts()


@pytest.mark.parametrize("flag,value,says", [
    ("--max-tokens", "16", "--max-tokens: api = \"embeddings\" answers with one JSON object and generates no token"),
    ("--slo", "ttft=100ms", "--slo: ttft: api = \"embeddings\""),
    ("--backend", "ollama", "it needs backend = \"openai\""),
])
def test_refused_up_front(tmp_path, flag, value, says):
    out = tmp_path / "run"
    p = loadgen("run", pooling_workload(tmp_path, "embeddings", 4), "--out", str(out), "--quiet", flag, value)
    assert p.returncode == 2, p.stderr
    assert says in p.stderr and "Traceback" not in p.stderr
    assert not (out / "requests.parquet").exists()


class _BadAnswers(BaseHTTPRequestHandler):
    """A server whose /v1/embeddings answers 200 in turn: a good answer, an error object, JSON cut short, an
    answer without `data`, a non-object; /v1/models lists model "m"; anything else is 404."""
    ANSWERS = [b'{"data": [{"embedding": [0.5, 0.25]}], "usage": {"prompt_tokens": 9, "total_tokens": 9}}',
               b'{"error": {"message": "the engine is overloaded", "type": "ServiceUnavailable", "code": 503}}',
               b'{"object": "list", "data": [{"embedding": [0.1, ',
               b'{"object": "list", "usage": {"prompt_tokens": 9, "total_tokens": 9}}',
               b'"embedding"']
    served = 0
    lock = threading.Lock()

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')
        else:
            self._send(404, b'{"error": "not found"}')

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/embeddings":
            self._send(404, b'{"error": "not found"}')
            return
        with self.lock:
            i, _BadAnswers.served = _BadAnswers.served, _BadAnswers.served + 1
        self._send(200, self.ANSWERS[i % len(self.ANSWERS)])


def test_bad_answers_from_a_server_are_typed_rows(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BadAnswers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "run"
        url = f"http://127.0.0.1:{server.server_address[1]}"
        p = loadgen("run", pooling_workload(tmp_path, "embeddings", 10), "--model", "m", "--url", url, "--out",
                    str(out), "--quiet", "--tokenizer", "approximate", "--max-concurrency", "1", *RELAXED_SELFCHECK)
    finally:
        server.shutdown()
        server.server_close()
    assert p.returncode == 3, p.stderr      # 80 % failed: invalid by the error rate, never a traceback
    assert "Traceback" not in p.stderr
    rows = read_run(out).requests.sort("dispatched_ns")
    got = [(r["outcome"], r["error_kind"]) for r in rows.iter_rows(named=True)]
    want = [("ok", None), ("stream_error", "error_event"), ("stream_error", "malformed_chunk"),
            ("stream_error", "malformed_chunk"), ("stream_error", "malformed_chunk")] * 2
    assert got == want
    details = rows["error_detail"].to_list()
    assert details[1] == "the engine is overloaded" and "answer is not JSON" in details[2]
    assert "no `data` list" in details[3] and "not a JSON object" in details[4]
    assert rows.filter(pl.col("outcome") == "ok")["prompt_tokens"].to_list() == [9, 9]
    s = report_json(str(out))
    assert s["requests"]["failed"] == 8 and s["latency_ms"]["e2e"]["p50"] is not None


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=orjson.dumps(body), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, orjson.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, orjson.loads(e.read())


def test_the_sims_answers():
    with SimProcess(args=["--mode", "fixed", "--ttft", "2ms", "--embedding-dim", "4"]) as sim:
        st, a = _post(sim.url + "/v1/embeddings", {"model": "x", "input": ["kalo mine rusa", "tevo zupe"]})
        assert st == 200 and [d["index"] for d in a["data"]] == [0, 1] and a["model"] == "x"
        assert all(len(d["embedding"]) == 4 for d in a["data"]) and a["data"][0] != a["data"][1]
        assert a["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
        _, again = _post(sim.url + "/v1/embeddings", {"model": "x", "input": "kalo mine rusa", "dimensions": 3,
                                                      "encoding_format": "base64"})
        vec = struct.unpack("<3f", base64.b64decode(again["data"][0]["embedding"]))
        assert list(vec) == pytest.approx(a["data"][0]["embedding"][:3])   # deterministic in the text
        st, r = _post(sim.url + "/v1/rerank", {"query": "kalo mine", "documents": ["a b c", {"text": "d"}, "e f"],
                                                "top_n": 2})
        assert st == 200 and len(r["results"]) == 2 and r["usage"] == {"total_tokens": 3 * 2 + 3 + 1 + 2}
        scores = [x["relevance_score"] for x in r["results"]]
        assert scores == sorted(scores, reverse=True) and all(0 < x < 1 for x in scores)
        for path, body in (("/v1/embeddings", {"input": []}), ("/v1/rerank", {"query": "q"}),
                           ("/v1/embeddings", {"input": "x", "encoding_format": "int8"})):
            st, err = _post(sim.url + path, body)
            assert st == 400 and err["object"] == "error" and err["message"], (path, err)
