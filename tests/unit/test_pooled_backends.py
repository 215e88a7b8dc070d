"""The pooling backends (api = "embeddings" | "rerank"): their bodies, and their answers parsed into rows: vLLM
0.32's real answers replayed from byte transcripts (tests/data/vllm/, tests/e2e/record_vllm_pooling.py) and
hand-written answers for what a server may do wrong (an error object in a 200, a body cut short, the shape's
field missing)."""
from array import array

import orjson
import pytest

from loadgen.client.backends import make_backend
from loadgen.client.backends.pooled import EmbeddingsBackend, RerankBackend
from loadgen.client.recorder import OK, STREAM_ERROR, ErrorKind, Row
from tests.transcripts import Transcript


def run(backend, reads: list[bytes], stamps: list[int] | None = None) -> Row:
    row = Row(0, "r0", 0, 8, 0)
    backend.interpret(row, array("q", stamps or range(1, len(reads) + 1)), reads)
    return row


def no_tokens(row: Row) -> None:
    assert (row.first_token_ns, row.first_answer_ns) == (None, None)
    assert (row.output_tokens, row.reasoning_tokens, row.n_chunks) == (0, 0, 0)
    assert not row.chunk_t_ns and not row.chunk_tokens


def test_make_backend_picks_them_by_api():
    assert isinstance(make_backend("openai", "embeddings", "m", {}), EmbeddingsBackend)
    assert isinstance(make_backend("openai", "rerank", "m", {}), RerankBackend)
    assert make_backend("openai", "embeddings", "m", {}).path == "/v1/embeddings"
    assert make_backend("openai", "rerank", "m", {}).path == "/v1/rerank"


def test_bodies():
    e = EmbeddingsBackend("embeddings", "m", {"encoding_format": "base64"})
    assert orjson.loads(e.body("kalo mine", 0)) == {"model": "m", "input": "kalo mine", "encoding_format": "base64"}
    # a conversation (a [prefix] as system text) is one input, its contents joined by newlines
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "kalo"}]
    assert orjson.loads(e.body_messages(msgs, 16, model="lora")) == {"model": "lora", "input": "be brief\nkalo",
                                                                     "encoding_format": "base64"}
    with pytest.raises(ValueError, match="priority"):
        e.body("x", 0, priority=1)
    r = RerankBackend("rerank", "m", {"top_n": 2})
    assert orjson.loads(r.body_documents("q", ["a b", "c"])) == {"model": "m", "query": "q",
                                                                 "documents": ["a b", "c"], "top_n": 2}
    assert orjson.loads(r.body_documents("q", ["a"], model="other"))["model"] == "other"
    with pytest.raises(ValueError, match="documents"):
        r.body("q", 0)


@pytest.mark.parametrize("name", ["embeddings_float", "embeddings_base64"])
def test_recorded_vllm_embeddings(name):
    t = Transcript("vllm", name)
    assert t.status == 200 and t.path == "/v1/embeddings"
    stamps = list(range(10, 10 + len(t.body_reads)))
    row = run(EmbeddingsBackend("embeddings", "tiny", {}), t.body_reads, stamps)
    assert row.outcome == OK and row.error_kind is None
    no_tokens(row)
    assert row.last_token_ns == stamps[-1]          # the read that completed the answer
    answer = t.json()
    # vLLM's usage.prompt_tokens: its /tokenize count of the raw input (BOS included)
    assert row.prompt_tokens == answer["usage"]["prompt_tokens"] == t.doc["tokenize"][0]
    vector = answer["data"][0]["embedding"]
    assert isinstance(vector, list if name == "embeddings_float" else str) and vector


def test_recorded_vllm_rerank():
    t = Transcript("vllm", "rerank")
    assert t.status == 200 and t.path == "/v1/rerank"
    row = run(RerankBackend("rerank", "tiny", {}), t.body_reads)
    assert row.outcome == OK and row.last_token_ns == len(t.body_reads)
    no_tokens(row)
    answer = t.json()
    assert sorted(r["index"] for r in answer["results"]) == [0, 1]
    # an embedding model's rerank counts the query once and each document (each with its BOS): vLLM's own count
    assert row.prompt_tokens == answer["usage"]["total_tokens"] == sum(t.doc["tokenize"])


def test_rerank_usage_without_prompt_tokens_reads_total_tokens():
    body = {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.1}],
            "usage": {"total_tokens": 42}}
    row = run(RerankBackend("rerank", "m", {}), [orjson.dumps(body)])
    assert row.outcome == OK and row.prompt_tokens == 42


def test_an_answer_split_over_reads_is_stamped_by_its_last_read():
    body = orjson.dumps({"data": [{"embedding": [0.1, 0.2]}], "usage": {"prompt_tokens": 7, "total_tokens": 7}})
    row = run(EmbeddingsBackend("embeddings", "m", {}), [body[:5], body[5:20], body[20:]], [100, 200, 300])
    assert row.outcome == OK and row.last_token_ns == 300 and row.prompt_tokens == 7


def test_no_usage_leaves_prompt_tokens_null():
    row = run(EmbeddingsBackend("embeddings", "m", {}), [b'{"data": [{"embedding": [0.5]}]}'])
    assert row.outcome == OK and row.prompt_tokens is None


@pytest.mark.parametrize("api,reads,kind,says", [
    # an error object inside a 200 (OpenAI's shape, and vLLM's older top-level one)
    ("embeddings", [b'{"error": {"message": "input too long", "type": "BadRequestError", "code": 400}}'],
     ErrorKind.ERROR_EVENT, "input too long"),
    ("rerank", [b'{"object": "error", "message": "model busy", "type": "ServiceUnavailable", "code": 503}'],
     ErrorKind.ERROR_EVENT, "model busy"),
    # not JSON (a body cut in half), not an object, nothing at all
    ("embeddings", [b'{"object": "list", "data": [{"embedding": [0.1, '], ErrorKind.MALFORMED_CHUNK, "not JSON"),
    ("rerank", [b'[1, 2]'], ErrorKind.MALFORMED_CHUNK, "not a JSON object"),
    ("embeddings", [], ErrorKind.INCOMPLETE_STREAM, "no body"),
    # the shape's field missing or wrong
    ("embeddings", [b'{"object": "list", "usage": {"prompt_tokens": 3}}'], ErrorKind.MALFORMED_CHUNK, "no `data`"),
    ("embeddings", [b'{"data": []}'], ErrorKind.MALFORMED_CHUNK, "no `data`"),
    ("embeddings", [b'{"data": [{"index": 0}]}'], ErrorKind.MALFORMED_CHUNK, "data[0] has no embedding"),
    ("rerank", [b'{"data": [{"embedding": [1.0]}]}'], ErrorKind.MALFORMED_CHUNK, "no `results`"),
    ("rerank", [b'{"results": [{"index": 0, "relevance_score": 0.5}, {"index": "1", "relevance_score": 0.2}]}'],
     ErrorKind.MALFORMED_CHUNK, "results[1] is not"),
    ("rerank", [b'{"results": [{"index": 0}]}'], ErrorKind.MALFORMED_CHUNK, "results[0] is not"),
    ("rerank", [b'{"results": [{"index": -1, "relevance_score": 0.5}]}'], ErrorKind.MALFORMED_CHUNK, "results[0]"),
])
def test_bad_answers_are_typed_failures(api, reads, kind, says):
    backend = EmbeddingsBackend(api, "m", {}) if api == "embeddings" else RerankBackend(api, "m", {})
    row = run(backend, reads)
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, kind)
    assert says in row.error_detail, row.error_detail
    assert row.last_token_ns is None    # no e2e for a failed answer
    no_tokens(row)


def test_reply_text_is_empty():
    assert EmbeddingsBackend("embeddings", "m", {}).reply_text([b'{"data": [{"embedding": [1]}]}']) == ""


def test_the_progress_window_holds_a_pooled_answers_e2e():
    # the progress line's p50: TTFT of streamed rows; a pooling answer has none, so its e2e goes to its own window
    from loadgen.client.recorder import Recorder
    row = run(EmbeddingsBackend("embeddings", "m", {}), [b'{"data": [{"embedding": [1]}]}'], [5_000])
    row.intended_ns = 1_000
    rec = Recorder([row])
    rec.finish(row)
    assert rec.ttft_window_ns == [] and rec.e2e_window_ns == [4_000] and rec.done == 1
