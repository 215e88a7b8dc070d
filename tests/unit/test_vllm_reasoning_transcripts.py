"""vLLM 0.32 streaming reasoning, replayed from byte transcripts (tests/data/vllm/chat_reasoning_*.json,
tests/e2e/record_vllm_reasoning.py): the tiny think model under `--reasoning-parser qwen3` and under
`--reasoning-parser deepseek_r1`, the same seeded request, so the same 12 tokens: 7 streamed as
`delta.reasoning`, the first `</think>` as no delta at all (the parsers skip a lone marker), then 4 as
content (the last a second `</think>`, streamed as content text). The parsers differ in the usage only: qwen3
says `reasoning_tokens` 7 (the reasoning its engine emitted), deepseek_r1 says 0 (it counts the tokens
between a generated `<think>` and `</think>`, and the model generated no `<think>`)."""
from array import array

import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import OK, Row
from tests.transcripts import Transcript
from tests.unit.test_event_stream_backends import event_stamps

PARSERS = ("qwen3", "deepseek_r1")


def replay(t: Transcript) -> Row:
    row = Row(0, "r0", 0, 17, 12)
    OpenAIBackend("chat", "tiny", {}).interpret(row, array("q", range(1, len(t.body_reads) + 1)), t.body_reads)
    return row


def deltas(t: Transcript) -> list[dict]:
    return [c["delta"] for e in t.events() if e != b"[DONE]" for c in e["choices"]]


@pytest.mark.parametrize("parser", PARSERS)
def test_recorded_reasoning_stream(parser):
    t = Transcript("vllm", f"chat_reasoning_{parser}")
    ds = deltas(t)
    reasoning = [d["reasoning"] for d in ds if d.get("reasoning")]
    content = [d["content"] for d in ds if d.get("content")]
    usage = [e for e in t.events() if e != b"[DONE]" and e.get("usage")][-1]["usage"]
    assert (len(reasoning), len(content), usage["completion_tokens"]) == (7, 4, 12) and content[-1] == "</think>"
    assert usage["completion_tokens_details"] == {"reasoning_tokens": {"qwen3": 7, "deepseek_r1": 0}[parser]}
    row = replay(t)
    r_stamps, a_stamps = event_stamps(t.body_reads, b'"reasoning"'), event_stamps(t.body_reads, b'"content":"')
    a_stamps = [s for s in a_stamps if s >= r_stamps[-1]][-4:]   # the role chunk's empty content is no token
    assert row.outcome == OK and row.output_tokens == 12 and row.n_chunks == 11   # the first </think>: no chunk
    assert list(row.chunk_t_ns) == r_stamps + a_stamps
    assert (row.first_token_ns, row.first_answer_ns, row.last_token_ns) == (r_stamps[0], a_stamps[0], a_stamps[-1])
    assert row.first_token_ns < row.first_answer_ns
    # 12 tokens over 11 chunks: one each and the silent marker's by text length (backends/stream.py)
    assert sum(row.chunk_tokens) == 12 and sorted(row.chunk_tokens) == [1] * 10 + [2]
    if parser == "qwen3":
        assert row.reasoning_tokens == 7          # the server's count
    else:
        # the server's 0 is below the 7 reasoning chunks: counted by the rule, which gives the marker's
        # token to the longest chunk (` eigenvalues`, reasoning): one more than vLLM's qwen3 count
        assert row.reasoning_tokens == sum(row.chunk_tokens[:7]) == 8
        assert max(range(11), key=lambda i: (row.chunk_tokens[i], -i)) == reasoning.index(" eigenvalues") == 0
