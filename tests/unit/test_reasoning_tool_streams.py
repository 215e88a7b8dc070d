"""Reasoning and tool-call streams through the OpenAI backend's public interface (interpret): transcripts
in the shapes vLLM and SGLang write them (field names and nesting as their chat chunk serializers emit
them), one read per event, stamps 10, 20, 30, ..."""
from array import array

import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.recorder import OK, STREAM_ERROR, Row

HEAD = '"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'


def ev(delta: str, finish: str = "null") -> bytes:
    return (f'data: {{{HEAD}"choices":[{{"index":0,"delta":{delta},"logprobs":null,'
            f'"finish_reason":{finish}}}]}}\n\n').encode()


def usage(n: int, details: str = "") -> bytes:
    extra = f',"completion_tokens_details":{details}' if details else ""
    return (f'data: {{{HEAD}"choices":[],"usage":{{"prompt_tokens":9,"total_tokens":{9 + n},'
            f'"completion_tokens":{n}{extra}}}}}\n\n').encode()


DONE = b"data: [DONE]\n\n"
ROLE = ev('{"role":"assistant","content":""}')


def vllm_reasoning(field: str, details: str = "") -> list[bytes]:
    # vLLM with a reasoning parser: role chunk, thinking deltas, then the answer as content
    return [ROLE, ev(f'{{"{field}":"Okay"}}'), ev(f'{{"{field}":", the"}}'), ev(f'{{"{field}":" user"}}'),
            ev('{"content":"Paris"}'), ev('{"content":"."}', '"stop"'), usage(5, details) + DONE]


def vllm_tool_call() -> list[bytes]:
    # vLLM's hermes tool parser: the call's id, type and name first, then its arguments in pieces
    return [ROLE,
            ev('{"tool_calls":[{"id":"chatcmpl-tool-7","type":"function","index":0,'
               '"function":{"name":"get_weather"}}]}'),
            ev('{"tool_calls":[{"index":0,"function":{"arguments":"{\\"city\\": \\""}}]}'),
            ev('{"tool_calls":[{"index":0,"function":{"arguments":"Paris"}}]}'),
            ev('{"tool_calls":[{"index":0,"function":{"arguments":"\\"}"}}]}'),
            ev('{"content":""}', '"tool_calls"'), usage(4) + DONE]


def sglang(kind: str, text: str) -> bytes:
    # SGLang writes every delta field, null when unused
    fields = {"content": "null", "reasoning_content": "null", "tool_calls": "null", kind: f'"{text}"'}
    body = ",".join(f'"{k}":{v}' for k, v in fields.items())
    return ev('{"role":null,' + body + "}")


def replay(reads: list[bytes], api: str = "chat") -> Row:
    row = Row(0, "r0", 0, 9, 16)
    OpenAIBackend(api, "m", {}).interpret(row, array("q", [10 * (i + 1) for i in range(len(reads))]), reads)
    return row


def took_fast_path(reads: list[bytes]) -> bool:
    row = Row(0, "r0", 0, 9, 16)
    return OpenAIBackend("chat", "m", {})._interpret_fast(row, array("q", range(1, len(reads) + 1)), reads)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_is_output_but_the_answer_starts_later(field):
    row = replay(vllm_reasoning(field))
    assert row.outcome == OK
    assert (row.first_token_ns, row.first_answer_ns, row.last_token_ns) == (20, 50, 60)
    assert list(row.chunk_t_ns) == [20, 30, 40, 50, 60] and row.output_tokens == 5
    assert row.reasoning_tokens == 3  # the usage says nothing: counted from the reasoning chunks


def test_the_servers_reasoning_count_wins():
    # 7 tokens over 5 chunks: the counting rule would give the 3 reasoning chunks more than 3; the server says 3
    reads = vllm_reasoning("reasoning_content")
    reads[-1] = usage(7, '{"reasoning_tokens":3}') + DONE
    row = replay(reads)
    assert row.reasoning_tokens == 3 < sum(row.chunk_tokens[:3]) and row.first_answer_ns == 50


@pytest.mark.parametrize("said", [0, 2])
def test_a_server_count_below_the_reasoning_chunks_is_counted_instead(said):
    # 3 reasoning chunks are at least 3 tokens: a count of 0 or 2 is one the stream contradicts (vLLM 0.32's
    # deepseek_r1 parser says 0 when the model generated no <think>: tests/unit/test_vllm_reasoning_transcripts.py)
    row = replay(vllm_reasoning("reasoning", f'{{"reasoning_tokens":{said}}}'))
    assert row.reasoning_tokens == 3 and row.output_tokens == 5 and row.first_answer_ns == 50


def test_reasoning_tokens_spread_by_the_counting_rule():
    # 9 tokens over 5 chunks: one each, the other 4 by text length; the reasoning chunks' share is counted
    reads = vllm_reasoning("reasoning_content")
    reads[-1] = usage(9) + DONE
    row = replay(reads)
    assert sum(row.chunk_tokens) == 9
    assert row.reasoning_tokens == sum(row.chunk_tokens[:3]) and row.reasoning_tokens > 3


def test_a_tool_call_only_stream_is_timed_like_content():
    row = replay(vllm_tool_call())
    assert row.outcome == OK
    assert (row.first_token_ns, row.first_answer_ns, row.last_token_ns) == (20, 20, 50)
    assert (row.n_chunks, row.output_tokens, row.reasoning_tokens) == (4, 4, 0)
    assert list(row.chunk_tokens) == [1, 1, 1, 1]


def test_reasoning_then_a_tool_call_with_a_mixed_event():
    # one event carries the end of the thinking and the start of the answer: two chunks, one stamp
    reads = [ROLE, ev('{"reasoning":"Need"}'), ev('{"reasoning":" weather","content":"Let me check."}'),
             ev('{"tool_calls":[{"id":"c1","type":"function","index":0,"function":{"name":"w","arguments":"{}"}}]}',
                '"tool_calls"'), usage(4) + DONE]
    row = replay(reads)
    assert row.outcome == OK
    assert list(row.chunk_t_ns) == [20, 30, 30, 40]
    assert (row.first_token_ns, row.first_answer_ns, row.reasoning_tokens) == (20, 30, 2)
    assert OpenAIBackend("chat", "m", {}).reply_text(reads) == "Let me check.w{}"  # the answer only


def test_a_stream_that_never_answers_has_no_first_answer():
    reads = [ROLE, ev('{"reasoning_content":"Hmm"}'), ev('{"reasoning_content":" so"}', '"length"'),
             usage(2) + DONE]
    row = replay(reads)
    assert (row.outcome, row.first_token_ns, row.first_answer_ns, row.reasoning_tokens) == (OK, 20, None, 2)


def test_sglang_null_fields_keep_a_plain_stream_on_the_fast_path():
    reads = [sglang("content", "Hello"), sglang("content", " world"),
             ev('{"role":null,"content":"!","reasoning_content":null,"tool_calls":null}', '"stop"'),
             usage(3, '{"reasoning_tokens":0}') + DONE]
    assert took_fast_path(reads)
    row = replay(reads)
    assert (row.first_token_ns, row.first_answer_ns, row.reasoning_tokens, row.n_chunks) == (10, 10, 0, 3)


@pytest.mark.parametrize("name", ["reasoning_content", "reasoning", "tool_calls", "sglang reasoning",
                                  "a reasoning count in the usage", "one token per event",
                                  "reasoning beside empty content"])
def test_the_fast_path_never_takes_reasoning_or_tool_calls(name):
    reads = {"reasoning_content": lambda: vllm_reasoning("reasoning_content"),
             "reasoning": lambda: vllm_reasoning("reasoning"),
             "tool_calls": vllm_tool_call,
             "sglang reasoning": lambda: [sglang("reasoning_content", "Hm"), sglang("content", "Hi"),
                                          ev('{"content":"!"}', '"stop"'), usage(3) + DONE],
             "a reasoning count in the usage": lambda: vllm_reasoning("reasoning", '{"reasoning_tokens":3}'),
             # every event one token, completion_tokens == events: only the fields tell them apart
             "one token per event": lambda: [ev('{"reasoning_content":"a"}'), ev('{"reasoning_content":"b"}'),
                                             ev('{"content":"c"}', '"stop"'), usage(3) + DONE],
             # a server that writes an empty content beside every reasoning delta: only the keys tell
             "reasoning beside empty content": lambda: [ev('{"reasoning_content":"a","content":""}'),
                                                        ev('{"reasoning_content":"b","content":""}'),
                                                        ev('{"content":"c"}', '"stop"'), usage(3) + DONE]}[name]()
    assert not took_fast_path(reads)
    row = replay(reads)
    if name == "tool_calls":
        assert row.first_answer_ns == row.first_token_ns and row.reasoning_tokens == 0
    else:
        assert row.first_answer_ns > row.first_token_ns and row.reasoning_tokens > 0


def test_a_tool_call_beside_content_text_is_one_answer_token_on_either_path():
    reads = [ev('{"content":"a"}'), ev('{"content":"","tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}'),
             ev('{"content":"b"}', '"stop"'), usage(3) + DONE]
    fast, full = Row(0, "r0", 0, 9, 16), Row(0, "r0", 0, 9, 16)
    t = array("q", [10, 20, 30, 40])
    OpenAIBackend("chat", "m", {}).interpret(fast, t, reads)
    OpenAIBackend("chat", "m", {})._interpret_full(full, t, reads)
    for f in ("outcome", "first_token_ns", "first_answer_ns", "last_token_ns", "reasoning_tokens", "n_chunks"):
        assert getattr(fast, f) == getattr(full, f), f
    assert list(fast.chunk_t_ns) == list(full.chunk_t_ns) == [10, 20, 30]


def test_content_that_mentions_the_keys_is_still_exact():
    # the key names inside content text (escaped quotes) send the stream to the full parse: same answer
    reads = [ev('{"content":"say \\"reasoning\\": and \\"tool_calls\\""}'), ev('{"content":"ok"}', '"stop"'),
             usage(2) + DONE]
    assert not took_fast_path(reads)
    row = replay(reads)
    assert (row.first_token_ns, row.first_answer_ns, row.reasoning_tokens, row.n_chunks) == (10, 10, 0, 2)


@pytest.mark.parametrize("delta, detail", [
    ('{"tool_calls":"get_weather"}', "delta.tool_calls is not a list"),
    ('{"tool_calls":[{"index":0,"function":{"arguments":{"city":"Paris"}}}]}',
     "delta.tool_calls function.arguments is not a string"),
    ('{"tool_calls":[7]}', "delta.tool_calls piece is not an object with a function"),
])
def test_a_bad_tool_call_is_a_stream_error_naming_it(delta, detail):
    row = replay([ROLE, ev(delta), ev('{"content":"x"}', '"stop"'), usage(2) + DONE])
    assert (row.outcome, row.error_kind) == (STREAM_ERROR, "malformed_chunk")
    assert row.error_detail.startswith(detail)
