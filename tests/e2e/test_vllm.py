"""End to end against a real vLLM (CPU build, tiny random-weight Llama, real 32k SPM tokenizer), default flags.

One server for the module (tests/e2e/vllm_server.py; VLLM_URL=http://... reuses a running one instead).
Every run goes through the CLI, then requests.parquet, manifest.json and the report are checked against
vLLM's own answers: `usage.prompt_tokens` per request, and its `/metrics` histograms scraped over the run.
Bounded: ~260 requests in all (144 of them the sweep's), outputs of 16-64 tokens; ~2 min 10 s with a running
server. Figures land in conftest.FIGURES.

The shipped multi-turn-chat.toml and shared-system-prompt.toml are run as they are, shortened by flags, and
exact (templates, system prompts and histories counted whole); a short sweep past vLLM's saturation names
TPOT growth at its top point (analysis/knee.py); a second identical run is still cold by vLLM's own
prefix-cache counters, and only a run given the first one's salt hits. Per-request server timings:
test_vllm_per_request.py; compare of --max-num-seqs 2 vs 16: the same module (2, then 16 seats).
"""
from __future__ import annotations

import io
import os
import textwrap
import time
from pathlib import Path

import orjson
import polars as pl
import pytest

from loadgen import metrics
from loadgen.analysis.abandon import FREED_BELOW
from loadgen.analysis.server_split import TOL_REL
from loadgen.probe.server_tokenizer import ServerTokenizer
from loadgen.probe.servers import detect
from loadgen.results.folder import read_run
from tests.e2e.conftest import FIGURES
from tests.e2e.vllm_server import MODEL_NAME, VllmServer, serve
from tests.integration.conftest import counter_delta, loadgen

EXTRA = '[request]\nextra_body = { ignore_eos = true }\n'
ATTEMPTS = 3   # runs of the decomposition check (see there)
WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    # its log names each request's end (test_abandoned_requests_and_whether_vllm_freed_their_slots)
    yield from serve(tmp_path_factory, "vllm", figure="vllm: start to healthy, s",
                     extra=("--enable-log-requests", "--enable-log-outputs", "--no-enable-log-deltas"))


def workload(tmp_path, name: str, api: str, body: str) -> str:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(f"""
        model = "{MODEL_NAME}"
        api = "{api}"
        seed = 7
        [run]
        drain_timeout = "120s"
        # data checks on a shared 2-core machine (vLLM holds one core): the self-check's rules are
        # unit-tested (test_selfcheck.py) and must not turn these into exit 3
        max_send_lag_p99 = "10s"
        max_lag_share = 1
        max_rate_deviation = 10
        max_cv_deviation = 100
        """) + textwrap.dedent(body) + EXTRA)
    return str(p)


def fresh_seed() -> str:
    # every run draws its own prompt salt (plan/bodies.py), so the same seed is cold too
    # (test_a_second_identical_run_is_still_cold); a fresh seed also varies the lengths and times.
    return str(int.from_bytes(os.urandom(4), "little"))


def run(vllm, wl: str, out, *flags: str, expect: int = 0, seed: str | None = None):
    p = loadgen("run", wl, "--url", vllm.url, "--out", str(out), "--quiet", "--seed", seed or fresh_seed(), *flags,
                timeout=600)
    assert p.returncode == expect, p.stderr[-3000:]
    return read_run(out), p.stderr


def check_rows(run_, n: int, max_tokens: int) -> pl.DataFrame:
    df = metrics.latency_columns(run_.requests, suffix="_ms")
    assert df.height == n and df["request_id"].n_unique() == n           # one row per request
    assert df["outcome"].to_list() == ["ok"] * n, df.filter(pl.col("outcome") != "ok")[["error_kind", "error_detail"]]
    assert (df["prompt_tokens"] == df["planned_prompt_tokens"]).all(), df[["planned_prompt_tokens", "prompt_tokens"]]
    assert (df["output_tokens"] == max_tokens).all()
    m = run_.manifest
    assert m["target"]["server"]["kind"] == "vllm", m["target"]["server"]
    lengths = m["workload"]["prompt_lengths"]
    assert lengths["exact"] and lengths["usage"] == {"compared": n, "equal": n, "max_abs_error": 0}, lengths
    assert m["workload"]["tokenizer"]["shape"] == "vllm"
    return df


def report(run_dir) -> dict:
    p = loadgen("report", str(run_dir), "--format", "json")
    assert p.returncode == 0, p.stderr
    return orjson.loads(p.stdout)


def test_detection_and_tokenizer(vllm):
    kind = detect(vllm.url)
    assert kind["kind"] == "vllm" and kind["version"] == "0.32.0", kind
    err = io.StringIO()
    tok = ServerTokenizer(vllm.url, "completions", progress=err)
    assert tok.shape == "vllm" and "probing" in err.getvalue()
    assert tok.count_prompt("Hello world") == 3        # [1, 15043, 3186]: BOS, as /v1/completions counts it
    chat = ServerTokenizer(vllm.url, "chat")
    # make_tiny_hf.py's template: BOS, "<|user|>\nHello world\n<|assistant|>\n" = 17 tokens in all
    assert chat.prompt_exact and chat.count_prompt("Hello world") == 17


# A client whose event loop ran this late (p99) was held back by the host, not measuring: a test whose
# finding needs the client's clock skips, naming the figures, when every attempt was held back this much.
HELD_BACK_MS = 50


def test_completions_exact_and_decomposition_against_vllms_histograms(vllm, tmp_path):
    # Poisson 5/s, 64-512-token prompts: the calibrated decomposition (vLLM reports no per-request timings
    # by default) against vLLM's own prefill and decode histograms over the same run, each mean within 10 %.
    # Premises, checked on every attempt: a cold prefix cache (a hit shortens vLLM's prefill below what
    # any idle-server fit says) and vLLM finished exactly the run's requests in the scrape window. The rate
    # keeps the engine running when most requests arrive (vLLM never queues here: 256 seats): a request
    # that arrives at an idle engine has no step boundary before its prefill for the client to see, its
    # start is its send, and the whole front-end round trip (HTTP, tokenisation, IPC, detokenisation) lands
    # in its prefill. Measured on the busy 2-core machine: at 2/s prefill +4 to +17 % (30 % of arrivals at
    # an idle engine), at 5/s +1 to +5 %; decode within ~1 %. A host that slows the API server's core can
    # still push one run past 10 %: up to ATTEMPTS runs are made and every attempt's figures are kept.
    wl = workload(tmp_path, "poisson", "completions", """
        [arrivals]
        process = "poisson"
        rate = "5/s"
        [prompt]
        tokens = { dist = "uniform", min = 64, max = 512 }
        [output]
        tokens = 32
        """)
    tried = []
    for attempt in range(ATTEMPTS):
        out = tmp_path / f"poisson-{attempt}"
        r, _ = run(vllm, wl, out, "--requests", "40", "--scrape-metrics", "--scrape-interval", "500ms")
        df = check_rows(r, 40, 32)
        s = report(out)
        sm = pl.read_parquet(out / "server_metrics.parquet")
        assert counter_delta(sm, "vllm:prefix_cache_hits_total") == 0          # cold
        assert counter_delta(sm, "vllm:prefix_cache_queries_total") > 0
        dm, hist = s["decomposition_ms"], s["server_histograms_ms"]
        assert dm["method"] == "calibrated" and dm["n"] == 40, dm["method"]
        assert hist["n"] == 40, hist                    # vLLM finished exactly the run's requests in the window
        errors = {c: dm["mean"][c] / hist[c] - 1 for c in ("prefill", "decode")}
        tried.append({c: round(e, 3) for c, e in errors.items()}
                     | {"client loop lateness p99 ms": r.manifest["generator"]["loop_lateness_ms"]["p99"]})
        if all(abs(e) <= TOL_REL for e in errors.values()):
            break
    FIGURES["vllm: decomposition vs vLLM's histograms, relative error per attempt"] = tried
    late = [t["client loop lateness p99 ms"] for t in tried]
    if not all(abs(e) <= TOL_REL for e in errors.values()) and min(late) > HELD_BACK_MS:
        # the premise: a client the host let keep its clock (CI: loop lateness p99 ~5 ms). Beside two CPU
        # burners every attempt's client stalled ~0.5 s (prefill read +52-73 %): not a measure of loadgen
        pytest.skip(f"the host held the client back on every attempt (loop lateness p99 {late} ms > "
                    f"{HELD_BACK_MS} ms): the decomposition is not judged there; attempts: {tried}")
    for comp in ("prefill", "decode"):
        assert dm["mean"][comp] == pytest.approx(hist[comp], rel=TOL_REL), (comp, dm["mean"], hist, tried)
    # queue means queue: vLLM never queued (default --max-num-seqs), so its queue is ~0 and loadgen's is
    # front-end and step-boundary time, named and, beyond the tolerance, flagged
    waiting = sm.filter(pl.col("name") == "vllm:num_requests_waiting")["value"]
    assert waiting.len() > 0 and waiting.max() == 0
    q = s["queue_split_ms"]
    assert q["engine_queue_ms"] == pytest.approx(hist["queue"]) and q["engine_queue_ms"] < 1.0, q
    assert q["front_end_ms"] == pytest.approx(dm["mean"]["queue"] - hist["queue"])
    assert q["front_end_ms"] > 0, q                     # HTTP, tokenisation, IPC: never free
    flagged = {d["component"] for d in q["disagreements"]}
    assert flagged <= {"queue"}, q["disagreements"]     # prefill and decode agree, as checked above
    assert ("queue" in flagged) == (q["front_end_ms"] > q["tolerance_ms"]["queue"])
    text = loadgen("report", str(out)).stdout
    assert "front-end/step-boundary time" in text and ("DISAGREE (queue)" in text) == ("queue" in flagged)
    FIGURES["vllm poisson 5/s, 64-512 prompts: TTFT p50 / p99 ms"] = (
        round(float(df["ttft_ms"].median()), 1), round(float(df["ttft_ms"].quantile(0.99)), 1))
    FIGURES["vllm: prefill mean ms, loadgen / vLLM"] = (round(dm["mean"]["prefill"], 1), round(hist["prefill"], 1))
    FIGURES["vllm: decode mean ms, loadgen / vLLM"] = (round(dm["mean"]["decode"], 1), round(hist["decode"], 1))
    FIGURES["vllm: queue mean ms, loadgen / vLLM engine; front-end ms"] = (
        round(dm["mean"]["queue"], 2), round(hist["queue"], 3), round(q["front_end_ms"], 2))


def test_chat_single_turn_exact(vllm, tmp_path):
    wl = workload(tmp_path, "chat", "chat", """
        [arrivals]
        process = "poisson"
        rate = "3/s"
        [prompt]
        tokens = { dist = "cycle", values = [64, 300] }
        [output]
        tokens = 16
        """)
    r, _ = run(vllm, wl, tmp_path / "chat", "--requests", "12", "--no-calibrate")
    df = check_rows(r, 12, 16)
    assert sorted(df["prompt_tokens"].to_list()) == [64] * 6 + [300] * 6   # chat template included


def test_trace_replay_chat(vllm, tmp_path):
    trace = tmp_path / "trace.jsonl"
    rows = [{"intended_ns": i * 250_000_000, "prompt_tokens": (64, 200)[i % 2], "max_tokens": 16} for i in range(10)]
    trace.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in rows))
    wl = workload(tmp_path, "trace", "chat", """
        [arrivals]
        process = "poisson"
        rate = "1/s"
        [prompt]
        tokens = 64
        [output]
        tokens = 16
        """)
    out = tmp_path / "trace"
    r, _ = run(vllm, wl, out, "--trace", str(trace), "--trace-format", "jsonl", "--no-calibrate")
    df = check_rows(r, 10, 16)
    assert sorted(df["prompt_tokens"].to_list()) == [64] * 5 + [200] * 5
    # replayed on the trace's own times: every request sent at its row's offset from t0
    sent = (df.sort("intended_ns")["intended_ns"] - df["intended_ns"].min()).to_list()
    assert sent == [i * 250_000_000 for i in range(10)]
    assert report(out)["decomposition_ms"]["method"] == "none"   # --no-calibrate, no server timings


# the shipped files' self-check thresholds are for a quiet client host; this one is a shared 2-core machine
LAX = ("--max-send-lag-p99", "10s", "--max-lag-share", "1", "--max-rate-deviation", "10", "--max-cv-deviation", "100")


def check_sessions_exact(r, n: int) -> pl.DataFrame:
    df = check_rows(r, n, 16)
    later = df.filter(pl.col("turn") > 0).height
    turns = r.manifest["generator"]["session_turns"]
    assert later > 0 and turns["built"] == later and turns["impossible"] == 0, (later, turns)
    return df


def test_multi_turn_chat_workload_exact(vllm, tmp_path):
    # workloads/multi-turn-chat.toml as shipped (300-token system prompt, 2-6 turns, think times), with flags:
    # 3 conversations, 16-token replies, and each new user message 60-120 tokens instead of the file's
    # lognormal down to 4: a later turn's new user message must hold the template's per-turn cost (~38 tokens
    # for the e2e model's ChatML over SPM), or the fit is impossible (counted, then not exact). Seed 6: 13
    # requests (10 later turns), the longest conversation's think times 14 s (seeds 1-12 give 5-34 s).
    out = tmp_path / "multi-turn"
    r, _ = run(vllm, str(WORKLOADS / "multi-turn-chat.toml"), out, "--model", MODEL_NAME, "--requests", "3",
               "--prompt-tokens", "60..120", "--max-tokens", "16", "--no-calibrate", *LAX, seed="6")
    df = check_sessions_exact(r, 13)
    assert df["turn"].max() >= 3 and df["prompt_tokens"].max() > 800          # histories grew, counted whole
    FIGURES["vllm multi-turn-chat: session turn prepare (vLLM /tokenize messages), mean/max ms"] = (
        round(r.manifest["generator"]["session_turns"]["prepare_mean_ms"], 1),
        round(r.manifest["generator"]["session_turns"]["prepare_max_ms"], 1))


def test_shared_system_prompt_workload_exact(vllm, tmp_path):
    # workloads/shared-system-prompt.toml as shipped (4 system prompts of 1,000 tokens, 90 % of requests carry
    # one, 1,100-1,600 tokens in all), shortened by flags: 12 requests at 2/s, 16-token replies, no warm-up
    out = tmp_path / "shared-system"
    r, _ = run(vllm, str(WORKLOADS / "shared-system-prompt.toml"), out, "--model", MODEL_NAME, "--requests", "12",
               "--rate", "2/s", "--warmup-requests", "0", "--max-tokens", "16", "--no-calibrate", *LAX)
    df = check_rows(r, 12, 16)
    assert df["prompt_tokens"].min() >= 1100 and df["prompt_tokens"].max() <= 1600
    assert df["prefix_group"].drop_nulls().n_unique() > 1          # the system prompts were in the requests


def test_sweep_sees_overload_as_tpot_growth(vllm, tmp_path):
    # Three short points against vLLM's defaults (256 seats: it admits everything and never queues), the
    # last past its saturation (~500-550 output tok/s here: 32/s x 64 tokens offers ~2,000): overload shows as
    # every step slowing, so the knee rule must name `tpot` at the top point, and not the server's waiting.
    # Ground truth: vLLM's own decode histogram over each point's window grew as loadgen's TPOT did, and its
    # waiting gauge stayed 0. Each point's prefix-cache hit rate, from vLLM's counters, is a figure (0 and 0
    # measured at 2 and 32/s; a hit would shorten prefill, not the decode steps judged here). 48 requests a
    # point: with 24, the base's completion rate read 7 % behind its offers on a busy host (Poisson noise
    # in a 12 s window) and the top's batch drained too soon for TPOT to double (16.4 -> 30.4 ms). ~55 s.
    wl = workload(tmp_path, "sweep", "completions", """
        [arrivals]
        process = "poisson"
        rate = "1/s"
        [prompt]
        tokens = { dist = "uniform", min = 64, max = 128 }
        [output]
        tokens = 64
        """)
    out = tmp_path / "sweep"
    p = loadgen("sweep", wl, "--url", vllm.url, "--out", str(out), "--quiet", "--seed", fresh_seed(),
                "--rates", "2,8,32/s", "--requests", "48", "--no-calibrate", "--scrape-metrics",
                "--scrape-interval", "250ms", timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = orjson.loads((out / "sweep_summary.json").read_bytes())
    pts = sorted(summary["points"], key=lambda x: x["rate_per_s"])
    rates = [x["rate_per_s"] for x in pts]
    # the sweep does not escalate past an over-saturated point (completing under half its offers): on a busy
    # host 8/s can already be one (measured: 3.1 of 13.4/s), and then it is the top
    stopped = (summary.get("search") or {}).get("stopped") or ""
    assert rates == [2, 8, 32] or (rates == [2, 8] and "over-saturated" in stopped), (rates, stopped)
    assert all(x["valid"] for x in pts), pts
    base, top = pts[0], pts[-1]
    vllm_decode, tpot, hits, late = [], [], [], []
    for x in (base, top):
        d = out / x["dir"]
        s = report(d)
        late.append(read_run(d).manifest["generator"]["loop_lateness_ms"]["p99"])
        sm = pl.read_parquet(d / "server_metrics.parquet")
        assert sm.filter(pl.col("name") == "vllm:num_requests_waiting")["value"].max() == 0   # never queued
        assert s["server_histograms_ms"]["n"] == 48, s["server_histograms_ms"]
        vllm_decode.append(s["server_histograms_ms"]["decode"])
        tpot.append(x["latency_ms"]["tpot"]["p50"])
        hits.append(round(counter_delta(sm, "vllm:prefix_cache_hits_total")
                          / counter_delta(sm, "vllm:prefix_cache_queries_total"), 2))
    if max(late) > HELD_BACK_MS:
        # the premise: a client the host let keep its clock at both judged points. Beside two CPU burners the
        # base (2/s) once read TTFT p50 914 ms, every stream in one read and completions 11 % behind its offers
        # ("completions"), the client's loop late by 1.4 s: the host's verdict, not vLLM's
        pytest.skip(f"the host held the client back (loop lateness p99 {late} ms at the base and top points, "
                    f"{HELD_BACK_MS} ms judged): saturation is not judged there")
    if vllm_decode[1] <= 2 * vllm_decode[0]:
        # the premise, from vLLM's own decode histogram: its steps slowed at the top point, so overload showed
        # as TPOT. Beside two CPU burners the knee rule once named `completions` alone at the top (8/s, then
        # completing under half its offers); a run where vLLM's own steps did not double is not judged
        pytest.skip(f"vLLM's own decode time grew only {vllm_decode} ms from the base to the top point "
                    f"(loadgen's TPOT p50 {tpot}; judged when it more than doubles)")
    assert base["saturated_by"] == [], base
    assert "tpot" in top["saturated_by"] and "server_waiting" not in top["saturated_by"], top
    assert summary["knee"]["saturated"] and summary["knee"]["first_saturated_per_s"] in (8, 32), summary["knee"]
    FIGURES["vllm sweep 2/8/32 per s, 64 out: TPOT p50 ms at the base and top points; vLLM decode mean ms"] = (
        [round(t, 1) for t in tpot], [round(v, 1) for v in vllm_decode])
    FIGURES["vllm sweep: rates, saturated_by per point, knee, stopped"] = (
        rates, [x["saturated_by"] for x in pts], summary["knee"]["rate_per_s"], stopped)
    FIGURES["vllm sweep: prefix-cache hit rate at the base and top points (shared seed)"] = hits


def test_a_second_identical_run_is_still_cold(vllm, tmp_path):
    # vLLM caches prefixes by default. The same workload and seed twice: each run draws its own prompt salt,
    # so vLLM's own counters (manifest.prefix_cache, read just before t0 and after the run) see ~no hits
    # the second time; the first run's salt given again (--prompt-salt) sends the same texts, and hits.
    wl = workload(tmp_path, "cold", "completions", """
        [arrivals]
        process = "poisson"
        rate = "3/s"
        [prompt]
        tokens = { dist = "cycle", values = [128, 256] }
        [output]
        tokens = 16
        """)
    flags = ("--requests", "12", "--no-calibrate")
    first, _ = run(vllm, wl, tmp_path / "first", *flags, seed="11")
    second, _ = run(vllm, wl, tmp_path / "second", *flags, seed="11")
    salt = first.manifest["config"]["prompt_salt"]
    assert salt is not None and second.manifest["config"]["prompt_salt"] != salt
    assert (first.requests["planned_prompt_tokens"] == second.requests["planned_prompt_tokens"]).all()
    warm, _ = run(vllm, wl, tmp_path / "warm", *flags, "--prompt-salt", str(salt), seed="11")
    cache = {name: r.manifest["prefix_cache"] for name, r in (("first", first), ("second", second), ("warm", warm))}
    assert all(c["source"] and c["queried_tokens"] > 0 for c in cache.values()), cache
    # cold: no hit; warm: a large share (vLLM counts whole 16-token blocks; measured 33 % here, where a
    # fresh salt gives 0.0)
    assert cache["second"]["hit_rate"] < 0.05 and cache["warm"]["hit_rate"] > 0.25, cache
    s2, s3 = report(tmp_path / "second")["prefix_cache"], report(tmp_path / "warm")["prefix_cache"]
    assert s2["expected_hit_rate"] == 0.0 and s2["mismatch"] is None, s2
    assert "the cache was warm" in (s3["mismatch"] or ""), s3
    same = loadgen("compare", str(tmp_path / "first"), str(tmp_path / "second"))
    differs = loadgen("compare", str(tmp_path / "first"), str(tmp_path / "warm"))
    assert same.returncode == differs.returncode == 0, differs.stderr
    assert "prefix-cache hit rate differs" not in same.stdout, same.stdout
    assert "prefix-cache hit rate differs" in differs.stdout, differs.stdout
    ttft = {n: metrics.latency_columns(r.requests)["ttft"].median() for n, r in
            (("first", first), ("second", second), ("warm", warm))}
    FIGURES["vllm cold rerun: hit rate first/second/warm"] = [round(c["hit_rate"], 3) for c in cache.values()]
    FIGURES["vllm cold rerun: TTFT p50 ms first/second/warm"] = [round(v, 1) for v in ttft.values()]


def test_abandoned_requests_and_whether_vllm_freed_their_slots(vllm, tmp_path):
    # [abandon] (issue 26 item 7): half the requests are closed 300 ms after dispatch, mid-stream. Whether
    # vLLM freed their slots is judged from its gauges (summary.abandoned.server_slots): freed when it held,
    # on average over the scrapes, less than FREED_BELOW requests more than the client had open.
    # The ground truth is vLLM's own log, each line stamped with its unix time (vllm_server.TIME_PREFIX): a cut
    # request ends either in "Request <id> aborted." (it noticed the close and stopped the engine) or in
    # "Generated response <id> (streaming complete)" (it generated every token). From the client's close to
    # that line, the request was held for nothing; summed over the cut requests and divided by the verdict's
    # window, that is the mean excess the gauges estimate, measured by the server itself.
    # Its generation counter is not that truth (it was before): a busy host delays the front end and the client,
    # so the engine may have generated a cut request's tokens before the close without the client seeing them;
    # and a close that comes after the server finished holds nothing.
    if not isinstance(vllm, VllmServer):
        pytest.skip("the truth is the server's own log: a vLLM this module started (VLLM_URL is set)")
    wl = workload(tmp_path, "abandon", "chat", """
        [arrivals]
        process = "poisson"
        rate = "3/s"
        [prompt]
        tokens = 32
        [output]
        tokens = 256
        [abandon]
        share = 0.5
        after_ms = 300
        """)
    run_, _ = run(vllm, wl, tmp_path / "abandon", "--requests", "24", "--no-calibrate", "--scrape-metrics",
                  "--scrape-interval", "100ms")
    req = run_.requests
    planned = req.filter(pl.col("abandon_after_ns").is_not_null())
    cut = planned.filter(pl.col("outcome") == "abandoned")
    assert cut.height >= 4 and set(req.filter(pl.col("abandon_after_ns").is_null())["outcome"]) == {"ok"}
    assert set(planned["outcome"]) <= {"abandoned", "ok"}   # an ok one finished before its 300 ms
    s = report(tmp_path / "abandon")
    slots = s["abandoned"]["server_slots"] or {"scrapes": 0, "excess_mean": float("nan")}   # None: no scrape
    assert s["errors"]["error_rate"] == 0 and s["requests"]["abandoned"] == cut.filter(~pl.col("warmup")).height

    ended = _ended_in_vllm(vllm, set(req["request_id"]), wait_s=60)
    assert not {r for r, (how, _) in ended.items() if how == "aborted"} - set(cut["request_id"]), ended
    t0_s = run_.manifest["t0"]["unix_ns"] / 1e9
    held = {r: ended[r][1] - (t0_s + d / 1e9) for r, d in zip(cut["request_id"], cut["done_ns"]) if r in ended}
    held = {r: h for r, h in held.items() if h > 0}   # still running in vLLM at the client's close
    window_s = (req["done_ns"].max() - cut["done_ns"].min()) / 1e9
    late = sum(held.values()) / window_s   # requests vLLM held past their close, on average over the window
    kept = sorted(r for r in held if ended[r][0] == "complete")   # generated to the end after their close
    FIGURES["vllm abandon: cut / running at the close / aborted by vLLM"] = [
        cut.height, len(held), sum(ended[r][0] == "aborted" for r in held)]
    FIGURES["vllm abandon: held past the close, requests on average (log) / excess (gauges)"] = [
        round(late, 3), round(slots["excess_mean"], 2)]
    if len(held) < 3:
        pytest.skip(f"only {len(held)} of {cut.height} cut requests were still running in vLLM at their close "
                    f"(the host delayed the client's closes past the server's ends): nothing to judge")
    if slots["scrapes"] < 5:
        # the gauges sampled at least 5 times (every 100 ms) between the first cut and the run's end. A busy host
        # slows the scrapes and the window both (3 once, in a fresh clone's `make test` with other tests beside
        # it): the verdict is then not judged on so few samples
        pytest.skip(f"the host let /metrics be sampled only {slots['scrapes']} times after the first cut "
                    f"(at least 5 judged): {slots}")
    if abs(late - FREED_BELOW) < FREED_BELOW / 2:
        # near the verdict's threshold the gauges' sampling decides: a starved front end notices closes late
        pytest.skip(f"vLLM held {late:.2f} requests past their close on average (its log), too near "
                    f"{FREED_BELOW} to judge the gauges' verdict ({slots})")
    assert slots["freed"] is (late < FREED_BELOW), (slots, late, held, kept)


def _ended_in_vllm(vllm: VllmServer, ids: set[str], wait_s: float) -> dict[str, tuple[str, float]]:
    """Request id -> ("aborted" | "complete", unix s) from vLLM's log (--enable-log-requests --enable-log-outputs),
    once every request it added has ended there (at most wait_s). vLLM names a request chatcmpl-<X-Request-Id>,
    and its engine's copy with a suffix of its own."""
    def ours(vllm_id: str) -> str:
        return vllm_id if vllm_id in ids else vllm_id.rsplit("-", 1)[0]

    deadline = time.monotonic() + wait_s
    while True:
        added, ended = set(), {}
        for t, m in vllm.logged(_LIFE):   # one read of the log a poll
            if m.lastgroup == "added":
                added.add(ours(m["added"]))
            else:
                ended[ours(m[m.lastgroup])] = (m.lastgroup, t)
        if added & ids <= ended.keys() or time.monotonic() > deadline:   # this run's requests, not the module's
            return ended
        time.sleep(0.5)


# a request's lines in vLLM's log: added to the engine; then aborted (the client went away) or its stream done
_LIFE = (r"Added request chatcmpl-(?P<added>\S+)\.$|Request chatcmpl-(?P<aborted>\S+) aborted\."
         r"|Generated response chatcmpl-(?P<complete>\S+) \(streaming complete\)")
