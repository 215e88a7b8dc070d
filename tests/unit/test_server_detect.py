"""Server kind detection (servers.classify) and tokenize-answer reading (server_tokenizer) on scripted
answers: no sockets. Real llama-server answers are replayed in test_llamacpp_transcripts.py."""
import orjson
import pytest

from loadgen.probe.server_tokenizer import plausible, tokens_in
from loadgen.probe.servers import classify


def ok(obj, headers=None):
    return 200, headers or {}, orjson.dumps(obj) if not isinstance(obj, bytes) else obj


NF = (404, {}, b'{"detail":"Not Found"}')

CASES = {
    "vllm": {"/v1/models": ok({"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]}),
             "/version": ok({"version": "0.11.0"}), "/props": NF, "/info": NF, "/api/version": NF,
             "/metrics": ok(b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0.0\n")},
    "sglang": {"/v1/models": ok({"object": "list", "data": [{"id": "m", "owned_by": "sglang"}]}),
               "/get_server_info": ok({"tp_size": 1}), "/metrics": ok(b"sglang:num_running_reqs 0\n")},
    "tgi": {"/v1/models": ok({"object": "list", "data": [{"id": "m", "owned_by": "m"}]}),
            "/info": ok({"model_id": "m", "router": "text-generation-router", "version": "3.3.0"}),
            "/metrics": ok(b"tgi_request_count 3\n")},
    "ollama": {"/v1/models": ok({"object": "list", "data": [{"id": "m", "owned_by": "library"}]}),
               "/api/version": ok({"version": "0.12.3"})},
    "llamacpp": {"/props": ok({"default_generation_settings": {}, "total_slots": 2, "build_info": "b1"},
                              {"server": "llama.cpp"}),
                 "/metrics": ok(b"llamacpp:requests_deferred 0\n")},
    "loadgen-sim": {"/v1/models": ok({"object": "list", "data": [{"id": "m", "owned_by": "loadgen-sim"}]}),
                    "/metrics": ok(b"vllm:num_requests_running 0.0\n")},
    "unknown": {"/v1/models": None, "/props": NF, "/metrics": (404, {}, b"")},
}


@pytest.mark.parametrize("kind", CASES)
def test_each_kind_is_recognised_by_its_own_clues(kind):
    got = classify(CASES[kind])
    assert got["kind"] == kind, got
    assert (got["evidence"] != []) == (kind != "unknown")


def test_versions_are_taken_where_given():
    assert classify(CASES["vllm"])["version"] == "0.11.0"
    assert classify(CASES["tgi"])["version"] == "3.3.0"
    assert classify(CASES["ollama"])["version"] == "0.12.3"


def test_tokenize_answers_by_shape():
    assert tokens_in("vllm", 200, b'{"count":3,"max_model_len":4096,"tokens":[1,2,3]}') == 3
    assert tokens_in("vllm", 200, b'{"count":3,"tokens":[1,2]}') is None        # contradicts itself
    assert tokens_in("llamacpp", 200, b'{"tokens":[5,6]}') == 2
    assert tokens_in("llamacpp", 200, b'{"tokens":[{"id":5,"piece":"a"}]}') == 1
    assert tokens_in("tgi", 200, b'[{"id":1,"text":"a","start":0,"stop":1}]') == 1
    assert tokens_in("llamacpp", 400, b'{"tokens":[1]}') is None
    assert tokens_in("vllm", 200, b"not json") is None


def test_an_empty_token_list_for_text_is_not_a_count():
    # llama-server answers the vLLM shape with {"tokens": []}: once taken as 0 tokens.
    n = tokens_in("vllm", 200, b'{"tokens":[]}')
    assert n == 0 and not plausible("kalo mine", n)
    assert plausible("", 0) and plausible("kalo mine", 3) and not plausible("ab", 40) and not plausible("a", None)


def test_tgi_chat_prompts_are_not_exact():
    from loadgen.probe.server_tokenizer import ServerTokenizer

    tok = object.__new__(ServerTokenizer)  # no server: only the shape's capability is asked
    tok.shape, tok.api, tok.prompt_exact = "tgi", "chat", True
    assert tok._chat_countable() is False
