"""Chat exact, templates included: against the simulator with a chat template of its own
(`--chat-template sim`: two tokens a message and two more, as a real template adds), the shipped
multi-turn-chat and shared-system-prompt workloads are sent with every request's usage.prompt_tokens
equal to its plan (the server's count of the whole message list), through vLLM's /tokenize `messages`
shape and llama.cpp's /apply-template + /tokenize."""
from pathlib import Path

import orjson
import pytest

from loadgen.results.folder import read_run
from loadgen.sim.process import SimProcess
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen
from tests.integration.test_tokenize_shapes import post

ROOT = Path(__file__).resolve().parents[2]


def templated_sim(*extra: str):
    sim = SimProcess(args=["--mode", "fixed", "--ttft", "10ms", "--itl", "1ms", "--chat-template", "sim", *extra])
    sim.start()
    return sim


@pytest.fixture(scope="module")
def vllm_sim():
    sim = templated_sim()
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def llamacpp_sim():
    sim = templated_sim("--emulate", "llamacpp")
    yield sim
    sim.stop()


MESSAGES = [{"role": "system", "content": "a b"}, {"role": "user", "content": "c d e"}]


def test_the_sims_template_counts_every_message_in_tokenize_and_usage(vllm_sim, llamacpp_sim):
    status, obj = post(vllm_sim.url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": True})
    assert status == 200 and obj["count"] == 5 + 2 * 2 + 2
    assert post(vllm_sim.url, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})[1]["count"] == 10
    status, obj = post(llamacpp_sim.url, "/apply-template", {"messages": MESSAGES})
    assert obj["prompt"] == "<|begin|> <|system|> a b <|end|> <|user|> c d e <|end|> <|assistant|>"
    status, obj = post(vllm_sim.url, "/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 2})
    assert status == 200 and obj["usage"]["prompt_tokens"] == 11


def shipped(tmp_path, name: str, **replace: str) -> Path:
    # The shipped workload; replace shortens what a test cannot wait for (think times)
    text = (ROOT / "workloads" / f"{name}.toml").read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    p = tmp_path / f"{name}.toml"
    p.write_text(text)
    return p


def run(tmp_path, sim, workload: Path, *flags: str, code: int = 0):
    out = tmp_path / "run"
    p = loadgen("run", str(workload), "--url", sim.url, "--out", str(out), "--quiet", "--no-calibrate",
                *RELAXED_SELFCHECK, *flags)
    assert p.returncode == code, p.stderr
    return read_run(out), p.stderr


def assert_exact(run) -> None:
    lengths = run.manifest["workload"]["prompt_lengths"]
    ok = run.requests.filter(run.requests["outcome"] == "ok")
    assert len(ok) == len(run.requests)
    assert ok["prompt_tokens"].to_list() == ok["planned_prompt_tokens"].to_list()
    assert lengths["exact"] and lengths["usage"]["equal"] == len(ok), lengths
    assert run.manifest["status"] == "complete"


FAST_THINK = {"median = 4000, sigma = 0.6, min = 500, max = 30000": "median = 40, sigma = 0.6, min = 5, max = 300"}


@pytest.mark.parametrize("emulate", ["vllm", "llamacpp"])
def test_multi_turn_chat_is_exact_every_turn(tmp_path, vllm_sim, llamacpp_sim, emulate):
    sim = vllm_sim if emulate == "vllm" else llamacpp_sim
    r, _ = run(tmp_path, sim, shipped(tmp_path, "multi-turn-chat", **FAST_THINK), "--requests", "8", "--rate", "8/s")
    assert_exact(r)
    later = r.requests.filter(r.requests["turn"] > 0)
    assert len(later) >= 8 and r.requests["turn"].max() >= 3
    turns = r.manifest["generator"]["session_turns"]
    assert turns["built"] == len(later) and turns["impossible"] == 0 and turns["prepare_max_ms"] > 0
    # each later turn's plan: the previous turn's + its reply + the new user message's tokens
    rows = {row["idx"]: row for row in r.requests.iter_rows(named=True)}
    for row in later.iter_rows(named=True):
        prev = rows[row["idx"] - 1]
        assert row["planned_prompt_tokens"] > prev["planned_prompt_tokens"] + prev["output_tokens"]


def test_shared_system_prompt_is_exact(tmp_path, vllm_sim):
    r, _ = run(tmp_path, vllm_sim, shipped(tmp_path, "shared-system-prompt"), "--requests", "30", "--rate", "30/s")
    assert_exact(r)
    assert r.requests["prefix_group"].drop_nulls().n_unique() >= 2


def test_messages_shorter_than_their_template_are_named(tmp_path, vllm_sim):
    # 2-token user messages: the template's markers alone cost more (first turn: 6 tokens beside the
    # system prompt; a later turn: 4 for the reply's and its own message's markers), so what comes
    # before each user text already exceeds the plan: the run says so and why (exit 3), and the
    # server's count of each is the shortest possible (the context with an empty message)
    w = shipped(tmp_path, "multi-turn-chat", **FAST_THINK,
                **{'median = 80, sigma = 0.7, min = 4, max = 1024': 'median = 2, sigma = 0.1, min = 2, max = 2'})
    r, err = run(tmp_path, vllm_sim, w, "--requests", "3", "--rate", "8/s", code=3)
    lengths = r.manifest["workload"]["prompt_lengths"]
    later = r.requests.filter(r.requests["turn"] > 0)
    assert r.manifest["workload"]["prompt_checks"]["impossible"] == 3  # every first turn
    assert r.manifest["generator"]["session_turns"]["impossible"] == len(later) > 0
    assert not lengths["exact"] and "3 prompts cannot be as short as planned" in lengths["reason"]
    assert "cannot be as short as planned" in err and "INVALID RUN" in err
    first = r.requests.filter(r.requests["turn"] == 0)
    assert (first["prompt_tokens"] - first["planned_prompt_tokens"]).to_list() == [4] * 3  # 6 markers - 2


def test_a_body_sent_is_the_plan_seen_by_the_server(vllm_sim):
    # the bodies of a shared-system-prompt plan, counted again by the server: the same whole-list count
    from loadgen.config import workload as config
    from loadgen.plan.schedule import build
    from loadgen.run.prepare import request_bodies
    from loadgen.client.backends import make_backend
    c = config.load(ROOT / "workloads" / "shared-system-prompt.toml")
    c = config.with_overrides(c, "test", requests=12)
    s = build(c)
    bodies, _, info = request_bodies(c, s, make_backend(c.backend, c.api, c.model, c.extra_body), vllm_sim.url)
    for body, n in zip(bodies, s.prompt_tokens.tolist()):
        msgs = orjson.loads(body)["messages"]
        assert post(vllm_sim.url, "/tokenize", {"messages": msgs})[1]["count"] == n
    assert info["prompt_lengths"]["exact"]


SIM_TEMPLATE = ("<|begin|> {% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def local_tokenizer(folder: Path, template: str | None) -> Path:
    # a word-level tokenizer.json (one token a word, as the simulator's) and, when given, the model's chat
    # template beside it in tokenizer_config.json, as a model folder ships them
    from tokenizers import Tokenizer, models, pre_tokenizers
    folder.mkdir()
    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    if template is not None:
        (folder / "tokenizer_config.json").write_bytes(orjson.dumps({"chat_template": template, "bos_token": "<s>"}))
    return folder / "tokenizer.json"


@pytest.mark.parametrize("template", [SIM_TEMPLATE, None])
def test_a_local_tokenizer_counts_with_the_models_own_template(tmp_path, vllm_sim, template):
    path = local_tokenizer(tmp_path / "model", template)
    old = 'max = 1600 }   # includes the 1,000 shared tokens'
    w = shipped(tmp_path, "shared-system-prompt",
                **{old: old + f'\ntokenizer = "local"\ntokenizer_file = "{path}"'})
    r, err = run(tmp_path, vllm_sim, w, "--requests", "12", "--rate", "30/s", code=0 if template else 3)
    assert r.manifest["workload"]["tokenizer"]["mode"] == "local"
    if template:
        assert_exact(r)
        assert "chat template from" in r.manifest["workload"]["tokenizer"]["detail"]
    else:  # no template beside it: said before the run, and the server's counts show it
        lengths = r.manifest["workload"]["prompt_lengths"]
        assert not lengths["exact"] and "chat template tokens NOT counted" in lengths["reason"]
        assert "chat template tokens NOT counted" in err
