"""Real llama-server answers, replayed from byte transcripts (tests/data/llamacpp/, no sockets), through
the backends, the tokenize-answer reader and the server detection."""
from array import array

import pytest

from loadgen.client.backends.llamacpp import LlamaCppBackend
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import OK, Row
from loadgen.probe.server_tokenizer import plausible, tokens_in
from loadgen.probe.servers import PATHS, classify
from tests.transcripts import Transcript

TEXT = "kalo mine rusa tevo"


def replay(backend, name: str) -> tuple[Row, Transcript]:
    t = Transcript("llamacpp", name)
    row = Row(0, "r0", 0, 8, 4)
    backend.interpret(row, array("q", range(1, len(t.body_reads) + 1)), t.body_reads)
    return row, t


@pytest.mark.parametrize("name,api", [("completions_stream", "completions"), ("chat_stream", "chat")])
def test_openai_stream_carries_llamacpp_timings(name, api):
    row, t = replay(OpenAIBackend(api, "tiny-llama", {}), name)
    last = [e for e in t.events() if e != b"[DONE]"][-1]
    assert row.outcome == OK and row.output_tokens == 4 == last["usage"]["completion_tokens"]
    assert row.prompt_tokens == last["usage"]["prompt_tokens"]
    # the timings object on the last chunk: once ignored by the OpenAI backend
    assert row.server_prefill_ms == last["timings"]["prompt_ms"]
    assert row.server_decode_ms == last["timings"]["predicted_ms"]
    assert row.server_queue_ms is None  # llama.cpp reports none; the decomposition derives it
    assert row.n_chunks == 4 and sum(row.chunk_tokens) == 4  # chat's role chunk (content null) is no token


def test_native_completion_stream():
    row, t = replay(LlamaCppBackend("completions", "tiny-llama", {}), "completion_native_stream")
    final = t.events()[-1]
    assert row.outcome == OK and row.output_tokens == 4 and row.prompt_tokens == final["tokens_evaluated"] == 8
    assert row.server_prefill_ms == final["timings"]["prompt_ms"]


def test_tokenize_answers():
    plain, special = Transcript("llamacpp", "tokenize_content"), Transcript("llamacpp", "tokenize_content_special")
    assert tokens_in("llamacpp", plain.status, plain.body) == 7
    assert tokens_in("llamacpp", special.status, special.body) == 8          # + BOS, as usage counts it
    assert special.json()["tokens"][1:] == plain.json()["tokens"]
    for other in ("tokenize_vllm_shape", "tokenize_vllm_chat_shape", "tokenize_tgi_shape"):
        t = Transcript("llamacpp", other)
        # 200 with no tokens: taken as a count of 0 once; now not plausible, so never used
        assert t.status == 200 and t.json() == {"tokens": []}
        n = tokens_in("vllm" if "vllm" in other else "tgi", t.status, t.body)
        assert not plausible(TEXT, n)
    tpl = Transcript("llamacpp", "apply_template").json()["prompt"]
    assert TEXT in tpl and tpl != TEXT  # llama-server applied a template (chatml by default)


def test_detection_from_recorded_answers():
    answers = {}
    for path in PATHS:
        t = Transcript("llamacpp", "get_" + path.strip("/").replace("/", "_"))
        answers[path] = (t.status, t.headers, t.body)
    got = classify(answers)
    assert got["kind"] == "llamacpp" and got["votes"] == {"llamacpp": 6}, got
