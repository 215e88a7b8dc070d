"""Request bodies: shared prefixes are identical within a group, Mooncake blocks share text exactly as
their hash ids say, ShareGPT turns supply the text, and a session's next turn carries the history."""
import textwrap
from pathlib import Path

import orjson
import pytest

from loadgen.config import workload as config
from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.backends import BACKENDS, Backend, make_backend
from loadgen.plan.bodies import Bodies
from loadgen.plan.datasets import DatasetError, load_sharegpt
from loadgen.plan.prompts import ApproximateTokenizer, PromptMaker
from loadgen.client.recorder import Row
from loadgen.plan.schedule import NONE, build
from tests.scripted import sse

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = ROOT / "tests" / "data" / "sharegpt_sample.json"


def plan(tmp_path, extra: str, api: str = "chat", backend: str = "openai"):
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(f"""
        model = "m"
        api = "{api}"
        seed = 3
        [arrivals]
        process = "constant"
        rate = "1/s"
        [run]
        requests = 12
        [prompt]
        tokens = {{ dist = "uniform", min = 40, max = 60 }}
        [output]
        tokens = 5
        """) + textwrap.dedent(extra))
    c = config.load(p)
    s = build(c)
    convs = load_sharegpt(c.dataset) if c.dataset else None
    b = Bodies(s, make_backend(backend, api, "m", {}), PromptMaker(ApproximateTokenizer()), c.seed, convs)
    return s, b, [orjson.loads(x) if x else None for x in b.build_all()]


def test_prefix_groups_share_their_system_prompt_exactly(tmp_path):
    s, _, bodies = plan(tmp_path, "[prefix]\ntokens = 30\ngroups = 2\nfraction = 0.6\n")
    systems = {}
    for g, body, n in zip(s.prefix_group.tolist(), bodies, s.prompt_tokens.tolist()):
        msgs = body["messages"]
        if g == NONE:
            assert [m["role"] for m in msgs] == ["user"]
        else:
            assert msgs[0]["role"] == "system" and len(msgs[0]["content"].split()) == 30
            systems.setdefault(g, set()).add(msgs[0]["content"])
        assert sum(len(m["content"].split()) for m in msgs) == n  # the prefix counts inside the prompt
    assert all(len(v) == 1 for v in systems.values()) and len(set().union(*systems.values())) == len(systems)


def test_mooncake_blocks_share_text_as_their_hash_ids_say(tmp_path):
    trace = ROOT / "workloads" / "traces" / "mooncake_synthetic.jsonl"
    s, _, bodies = plan(tmp_path, f'[trace]\nfile = "{trace}"\nlimit = 40\n', api="completions")
    words = [b["prompt"].split() for b in bodies]
    assert [len(w) for w in words] == s.prompt_tokens.tolist()
    pairs = 0
    for i in range(len(s)):
        for j in range(i):
            a, b = s.blocks[i], s.blocks[j]
            k = next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            shared = min(k * 512, len(words[i]), len(words[j]))
            if k:  # equal leading ids: equal leading text, exactly that long (up to a cut last block)
                pairs += 1
                assert words[i][:shared] == words[j][:shared]
            else:
                assert words[i][0] != words[j][0]
    assert pairs > 0


def test_sharegpt_human_turns_are_the_text(tmp_path):
    p = tmp_path / "d.toml"
    p.write_text(textwrap.dedent(f"""
        model = "m"
        api = "chat"
        [arrivals]
        process = "constant"
        rate = "1/s"
        [run]
        requests = 6
        [prompt]
        tokens = 10
        dataset = "{SHAREGPT}"
        [output]
        tokens = 5
        """))
    c = config.load(p)
    s = build(c)
    convs = load_sharegpt(SHAREGPT)
    assert len(convs) == 3 and convs.skipped == 1  # s3 has no human turn
    bodies = [orjson.loads(x) for x in Bodies(s, OpenAIBackend("chat", "m", {}), PromptMaker(ApproximateTokenizer()),
                                              c.seed, convs).build_all()]
    firsts = {t[0] for t in convs.human_turns}
    for body, n in zip(bodies, s.prompt_tokens.tolist()):
        assert body["messages"][0]["content"] in firsts and len(body["messages"][0]["content"].split()) == n


@pytest.mark.parametrize("text,expected", [
    ("{", "not valid JSON"),                                          # broken JSON
    ('{"a": 1}', "expected a JSON list"),                             # not a list
    ('[{"id": 1}]', "entry 0: missing a \\\"conversations\\\" list"), # entry without conversations
    ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "no conversation has a human turn"),
])
def test_bad_sharegpt_files(tmp_path, text, expected):
    p = tmp_path / "d.json"
    p.write_text(text)
    with pytest.raises(DatasetError) as e:
        load_sharegpt(p)
    assert any(expected.replace("\\", "") in m for m in e.value.problems), e.value.problems


def test_next_turn_carries_user_messages_and_the_actual_replies(tmp_path):
    s, b, bodies = plan(tmp_path, "[session]\nturns = 3\nthink_ms = 10\n[prefix]\ntokens = 8\nfraction = 1.0\n")
    assert bodies[1] is None  # built at run time
    reply = [sse('{"choices":[{"index":0,"delta":{"content":"tok tok "}}]}'),
             sse('{"choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":"length"}]}', "[DONE]")]
    assert OpenAIBackend("chat", "m", {}).reply_text(reply) == "tok tok tok "
    prev = Row(0, "r0", 0, int(s.prompt_tokens[0]), 5)
    prev.output_tokens = 3
    body, planned, tool_round = b.next_turn(1, prev, reply)
    assert tool_round is None  # not an agentic session
    msgs = orjson.loads(body)["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[2]["content"] == "tok tok tok " and msgs[1]["content"] == bodies[0]["messages"][1]["content"]
    assert planned == sum(len(m["content"].split()) for m in msgs) == 8 + s.new_tokens[0] + 3 + s.new_tokens[1]
    prev2 = Row(1, "r1", 0, planned, 5)
    prev2.output_tokens = 3
    body2, planned2, _ = b.next_turn(2, prev2, reply)
    msgs2 = orjson.loads(body2)["messages"]
    assert len(msgs2) == 6 and msgs2[:4] == msgs and planned2 == sum(len(m["content"].split()) for m in msgs2)


def test_ollama_chat_turns_carry_num_predict_and_the_ndjson_replies(tmp_path):
    # Before the Backend protocol, a conversation (prefix or history) was posted to Ollama's /api/chat in
    # the OpenAI shape (`max_tokens`, which Ollama ignores, instead of options.num_predict), and the reply
    # text of an NDJSON stream was read as '' so the history lost every reply.
    s, b, bodies = plan(tmp_path, "[session]\nturns = 2\nthink_ms = 10\n[prefix]\ntokens = 8\nfraction = 1.0\n",
                        backend="ollama")
    assert bodies[0]["options"] == {"num_predict": 5} and "max_tokens" not in bodies[0]
    assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user"]
    reply = [b'{"message":{"role":"assistant","content":"tok tok "},"done":false}\n',
             b'{"message":{"role":"assistant","content":"tok "},"done":false}\n{"message":{"role":"assistant",'
             b'"content":""},"done":true,"eval_count":3}\n']
    prev = Row(0, "r0", 0, int(s.prompt_tokens[0]), 5)
    prev.output_tokens = 3
    body = orjson.loads(b.next_turn(1, prev, reply)[0])
    assert body["options"] == {"num_predict": 5} and "max_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][2]["content"] == "tok tok tok "


@pytest.mark.parametrize("backend,api,reads,text", [
    # OpenAI completions SSE
    ("openai", "completions", [b'data: {"choices":[{"text":"a b"}]}\n\ndata: {"choices":[{"text":" c",'
                               b'"finish_reason":"length"}]}\n\ndata: [DONE]\n\n'], "a b c"),
    # Ollama /api/generate NDJSON, a line split across two reads
    ("ollama", "completions", [b'{"response":"a b","done":false}\n{"respo', b'nse":" c","done":true}\n'], "a b c"),
    # llama.cpp /completion SSE
    ("llamacpp", "completions", [b'data: {"content":"a b"}\n\ndata: {"content":" c","stop":true}\n\n'], "a b c"),
])
def test_every_backend_reads_back_its_reply_text(backend, api, reads, text):
    assert make_backend(backend, api, "m", {}).reply_text(reads) == text


def test_llamacpp_conversations_are_one_prompt_text():
    body = orjson.loads(make_backend("llamacpp", "chat", "m", {}).body_messages(
        [{"role": "system", "content": "P"}, {"role": "user", "content": "Q"}], 7))
    assert body["prompt"] == "P\nQ" and body["n_predict"] == 7


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_every_backend_implements_the_whole_protocol(name, api):
    b = make_backend(name, api, "m", {})
    members = [m for m in vars(Backend) if not m.startswith("_")] + list(Backend.__annotations__)
    assert all(hasattr(b, m) for m in members), [m for m in members if not hasattr(b, m)]


def test_the_salt_changes_every_text_and_no_length(tmp_path):
    # a run's salt (prompt.salt): another salt shares no word with this one, the same salt every word;
    # within a run the shared prefix is still one text per group
    s, _, _ = plan(tmp_path, "[prefix]\ntokens = 30\ngroups = 1\nfraction = 1.0\n")

    def texts(salt):
        b = Bodies(s, make_backend("openai", "chat", "m", {}), PromptMaker(ApproximateTokenizer()), 3, salt=salt)
        return [[m["content"] for m in orjson.loads(x)["messages"]] for x in b.build_all()]

    one, again, other = texts(11), texts(11), texts(12)
    assert one == again
    assert [[len(t.split()) for t in msgs] for msgs in one] == [[len(t.split()) for t in msgs] for msgs in other]
    assert len({msgs[0] for msgs in one}) == 1 and one[0][0] != other[0][0]
    words_one = {w for msgs in one for t in msgs for w in t.split()}
    words_other = {w for msgs in other for t in msgs for w in t.split()}
    assert len(words_one & words_other) < 0.01 * len(words_one)
