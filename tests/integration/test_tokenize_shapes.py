"""Tokenize shapes, server detection and the prompt-length verdict against the simulator emulating vLLM
(default) and llama.cpp (`--emulate llamacpp`), and against servers that never answer."""
from __future__ import annotations

import io
import socket
import threading
import time

import orjson
import pytest

from loadgen.probe.probe_http import Probe
from loadgen.plan.prompts import PromptMaker, TokenizerError
from loadgen.results.folder import read_run
from loadgen.probe.server_tokenizer import ServerTokenizer
from loadgen.probe.servers import detect
from loadgen.sim.process import SimProcess
from tests.integration.conftest import loadgen, workload


@pytest.fixture(scope="module")
def llamacpp_sim():
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "20ms", "--itl", "2ms", "--emulate", "llamacpp"])
    sim.start()
    yield sim
    sim.stop()


def post(url: str, path: str, body: dict) -> tuple[int, object]:
    p = Probe(url, 5.0)
    try:
        status, _, data = p.request("POST", path, orjson.dumps(body))
    finally:
        p.close()
    return status, orjson.loads(data)


def test_llamacpp_emulation_answers_as_llama_server(llamacpp_sim):
    url = llamacpp_sim.url
    assert post(url, "/tokenize", {"prompt": "kalo mine"}) == (200, {"tokens": []})   # the vLLM shape: nothing
    status, obj = post(url, "/tokenize", {"content": "kalo mine"})
    assert status == 200 and len(obj["tokens"]) == 2 and set(obj) == {"tokens"}
    status, obj = post(url, "/tokenize", {"content": "kalo mine", "with_pieces": True})
    assert [t["piece"] for t in obj["tokens"]] == ["kalo", "mine"]
    assert post(url, "/apply-template", {"messages": [{"role": "user", "content": "a b"}]}) == (200, {"prompt": "a b"})
    assert detect(url)["kind"] == "llamacpp"


def test_vllm_emulation_rejects_other_shapes(fixed_sim):
    status, obj = post(fixed_sim.url, "/tokenize", {"content": "kalo mine"})
    assert status == 400 and obj["object"] == "error"
    status, obj = post(fixed_sim.url, "/tokenize", {"model": "m", "messages": [{"role": "user", "content": "a b c"}],
                                                    "add_generation_prompt": True})
    assert status == 200 and obj["count"] == 3 and len(obj["tokens"]) == 3
    assert detect(fixed_sim.url)["kind"] == "loadgen-sim"


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_probe_finds_each_shape(fixed_sim, llamacpp_sim, api):
    err = io.StringIO()
    v = ServerTokenizer(fixed_sim.url, api, "sim", progress=err)
    ll = ServerTokenizer(llamacpp_sim.url, api, progress=err)
    assert (v.shape, ll.shape) == ("vllm", "llamacpp") and v.prompt_exact and ll.prompt_exact
    assert err.getvalue().count("probing") == 2 and "at most 5 s per request" in err.getvalue()
    maker = PromptMaker(ll)
    import numpy as np
    for n in (1, 64, 300):
        text = maker.text(n, np.random.default_rng(n), whole=True)
        assert ll.count_prompt(text) == n
    assert maker.summary()["exact"] == 3


def _silent_server(trickle: bool):
    # Accepts and never answers (or answers one byte a second forever): what must not hang a run.
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    stop = threading.Event()

    def serve():
        conns = []
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                conns.append(c)
            except OSError:
                pass
            if trickle:
                for c in conns:
                    try:
                        c.send(b"H" if c.fileno() >= 0 else b"")
                    except OSError:
                        pass
        for c in conns:
            c.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv, stop, t


@pytest.mark.parametrize("trickle", [False, True])
def test_tokenize_probe_has_a_total_deadline(trickle):
    srv, stop, t = _silent_server(trickle)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        start = time.monotonic()
        with pytest.raises(TokenizerError, match="no complete answer within 0.5 s"):
            ServerTokenizer(url, timeout_s=0.5)
        elapsed = time.monotonic() - start
        kind = detect(url, timeout_s=0.5)
    finally:
        stop.set()
        t.join()
        srv.close()
    assert elapsed < 30  # one deadline, not one per shape or per trickled byte (it was forever)
    assert kind["kind"] == "unknown" and kind["errors"]


def test_llamacpp_shape_run_is_exact_and_recorded(llamacpp_sim, tmp_path):
    wl = workload(tmp_path, requests=12, rate="30/s", max_tokens=4)
    out = tmp_path / "run"
    p = loadgen("run", wl, "--url", llamacpp_sim.url, "--out", str(out), "--no-calibrate", "--backend", "openai")
    assert p.returncode == 0, p.stderr
    assert "probing" in p.stderr and "server kind: llamacpp" in p.stderr
    m = read_run(out).manifest
    assert m["target"]["server"]["kind"] == "llamacpp" and m["workload"]["tokenizer"]["shape"] == "llamacpp"
    assert m["workload"]["prompt_lengths"]["exact"] and m["workload"]["prompt_lengths"]["usage"]["equal"] == 12


def test_inexact_lengths_are_loud_and_exit_4(fixed_sim, tmp_path):
    # A local tokenizer that is not the server's: its own checks pass, the server's usage disagrees.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["kalo mine rusa tevo zupe"] * 20, trainers.BpeTrainer(
        vocab_size=280, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    wl = workload(tmp_path, requests=8, rate="30/s", max_tokens=4)
    text = open(wl).read().replace('tokenizer = "auto"\n', 'tokenizer = "local"\ntokenizer_file = "tokenizer.json"\n')
    open(wl, "w").write(text)
    out = tmp_path / "inexact"
    p = loadgen("run", wl, "--url", fixed_sim.url, "--out", str(out), "--no-calibrate")
    assert p.returncode == 3, p.stderr
    assert "prompt lengths are NOT exact" in p.stderr
    lengths = read_run(out).manifest["workload"]["prompt_lengths"]
    assert not lengths["exact"] and lengths["usage"]["equal"] < 8 and "server counted" in lengths["reason"]
    rep = loadgen("report", str(out))
    assert rep.returncode == 0 and "NOT exact" in rep.stdout


def test_asked_approximate_is_a_note_and_exit_0(fixed_sim, tmp_path):
    wl = workload(tmp_path, requests=6, rate="30/s", max_tokens=4)
    text = open(wl).read().replace('tokenizer = "auto"\n', 'tokenizer = "approximate"\n')
    open(wl, "w").write(text)
    out = tmp_path / "approx"
    p = loadgen("run", wl, "--url", fixed_sim.url, "--out", str(out), "--no-calibrate")
    assert p.returncode == 0, p.stderr
    lengths = read_run(out).manifest["workload"]["prompt_lengths"]
    assert not lengths["exact"] and lengths["asked_approximate"] and "note: prompt lengths" in p.stderr


def _sim_answer(url: str, t):
    p = Probe(url, 5.0)
    try:
        return p.request(t.method, t.path, t.request_body if t.method == "POST" else None)
    finally:
        p.close()


def test_llamacpp_emulation_has_the_recorded_shapes(llamacpp_sim):
    # The same requests as recorded from a real llama-server (tests/data/llamacpp/): same status, same
    # answer keys, and the streams end the same way (timings on the last JSON event, then [DONE]).
    from tests.transcripts import Transcript

    for name in ("tokenize_content", "tokenize_content_special", "tokenize_vllm_shape", "tokenize_vllm_chat_shape",
                 "tokenize_tgi_shape", "apply_template", "get_props", "get_v1_models"):
        real = Transcript("llamacpp", name)
        status, _, body = _sim_answer(llamacpp_sim.url, real)
        assert status == real.status, name
        sim_obj, real_obj = orjson.loads(body), real.json()
        if name in ("get_props", "get_v1_models"):
            assert set(sim_obj) <= set(real_obj), name
        else:
            assert set(sim_obj) == set(real_obj), name
        if real_obj == {"tokens": []}:
            assert sim_obj == {"tokens": []}, name
    for name in ("completions_stream", "chat_stream"):
        real = Transcript("llamacpp", name)
        status, headers, body = _sim_answer(llamacpp_sim.url, real)
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        sim_events = [b[6:] for b in body.split(b"\n\n") if b.startswith(b"data: ")]
        sim_events = [e if e == b"[DONE]" else orjson.loads(e) for e in sim_events]
        real_events = real.events()
        assert sim_events[-1] == real_events[-1] == b"[DONE]"
        s_last, r_last = sim_events[-2], real_events[-2]
        assert set(s_last["timings"]) == set(r_last["timings"]) and "usage" in s_last
        assert [bool(e["choices"]) for e in sim_events[-3:-1]] == [bool(e["choices"]) for e in real_events[-3:-1]]
        assert [e["choices"][0].get("finish_reason") for e in sim_events[:-2] if e["choices"]][:-1] == \
            [None] * (len([e for e in sim_events[:-2] if e["choices"]]) - 1)
