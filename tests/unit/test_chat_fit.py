"""Chat prompts counted whole: the last user message is fitted so that the whole message list (a chat
template's per-message tokens included) counts the planned length; session turns are built off the
event loop and never delay or lengthen a turn's measured latency."""
import asyncio
import threading
import time

import numpy as np
import orjson
import pytest

from loadgen.client.backends.openai import OpenAIBackend
from loadgen.client.clock import LoopClock
from loadgen.client.recorder import DROPPED, OK, Recorder
from loadgen.client.runner import Runner
from loadgen.plan.prompts import ApproximateTokenizer, LocalTokenizer, PromptMaker, verdict
from tests.scripted import ScriptedTransport, completion_stream
from tests.unit.test_prompts import bpe_json  # noqa: F401  (the fixture)
from tests.unit.test_runner_sessions import MS, session_rows


def render(messages) -> str:
    # A template whose markers touch the text (so a BPE merges across them: not additive)
    return "<s>" + "".join(f"[{m['role']}]{m['content']}[/]" for m in messages) + "[assistant]"


class TemplatedBPE(LocalTokenizer):
    def __init__(self, path):
        super().__init__(path)
        self.calls = 0

    def count_messages(self, messages):
        self.calls += 1
        return self.count(render(messages))


class TemplatedWords(ApproximateTokenizer):
    # one token a word, two per message and two more: the simulator's --chat-template sim
    exact = True

    def __init__(self):
        self.calls = 0

    def count_messages(self, messages):
        self.calls += 1
        return sum(self.count(m["content"]) for m in messages) + 2 * len(messages) + 2


HISTORY = [{"role": "system", "content": "you are a kalo mine assistant"},
           {"role": "user", "content": "rusa tevo zupe?"}, {"role": "assistant", "content": "tok tok tok "}]


@pytest.mark.parametrize("context", [[], HISTORY[:1], HISTORY])
@pytest.mark.parametrize("n", [120, 121, 250, 401])
def test_the_whole_list_counts_the_plan_under_a_bpe_template(bpe_json, context, n):  # noqa: F811
    tok = TemplatedBPE(bpe_json)
    maker = PromptMaker(tok)
    text = maker.fit_last(context, n, np.random.default_rng(n))
    assert tok.count_messages([*context, {"role": "user", "content": text}]) == n
    assert tok.count(text) < n  # the template and the context came out of the user's text
    assert maker.summary() == {"prompts": 1, "checked": 1, "exact": 1, "max_abs_error": 0}
    assert tok.calls <= 40  # an interpolation search, then fillers: bounded, not one call per word


def test_a_context_longer_than_the_plan_is_named_impossible():
    tok = TemplatedWords()
    maker = PromptMaker(tok)
    assert maker.fit_last(HISTORY, 10, np.random.default_rng(0)) == ""  # HISTORY alone counts 10 + 8
    checks = maker.summary()
    assert checks["impossible"] == 1 and checks["exact"] == 0
    v = verdict(tok, checks, "auto")
    assert not v["exact"] and "cannot be as short as planned" in v["reason"]


def test_a_recurring_context_is_counted_once_when_the_template_is_additive():
    tok = TemplatedWords()
    maker = PromptMaker(tok)
    rng = np.random.default_rng(0)
    for n in range(40, 50):
        text = maker.fit_last(HISTORY[:1], n, rng, key=("prefix", 0))
        assert tok.count_messages([HISTORY[0], {"role": "user", "content": text}]) == n
    # 1 (the empty message) + 1 (the first search) + 10 counts by the test + 9 sampled round trips
    assert tok.calls == 1 + 1 + 10 + 9
    assert maker.summary()["exact"] == 10


def run_real(rows, next_body):
    async def main():
        runner = Runner(rows, [b"{}"] * len(rows), OpenAIBackend("completions", "m", {}), transport,
                        LoopClock(), Recorder(rows), next_body=next_body, next_body_blocks=True)
        return await runner.run(asyncio.Event()), runner
    transport = ScriptedTransport(lambda rid: completion_stream(2, 0.005, 0.001))
    return asyncio.run(main())


def test_a_slow_body_is_built_off_the_loop_and_delays_only_its_own_turn():
    rows = session_rows([0], 3, 10)  # think 10 ms; each body takes 150 ms to build
    threads = []

    def next_body(j, prev, reads):
        threads.append(threading.get_ident())
        time.sleep(0.15)
        return orjson.dumps({"turn": j}), 100 + j

    status, runner = run_real(rows, next_body)
    assert status == "complete" and all(r.outcome == OK for r in rows)
    assert threading.get_ident() not in threads and len(threads) == 2
    assert len(runner.prepare_ns) == 2 and min(runner.prepare_ns) >= 150 * MS
    for prev, r, prep in zip(rows, rows[1:], runner.prepare_ns):
        # due when its body was ready (later than done + think): the build is not in its latency
        assert r.intended_ns >= prev.done_ns + prep >= prev.done_ns + 150 * MS
        assert r.dispatched_ns >= r.intended_ns and r.planned_prompt_tokens == 100 + r.idx


def test_a_body_that_cannot_be_built_drops_the_rest_of_its_conversation():
    rows = session_rows([0], 3, 1)

    def next_body(j, prev, reads):
        raise RuntimeError("tokenize went away")

    status, _ = run_real(rows, next_body)
    assert status == "complete" and rows[0].outcome == OK
    assert [r.outcome for r in rows[1:]] == [DROPPED, DROPPED]
    assert "could not be built: RuntimeError: tokenize went away" in rows[1].error_detail


def test_the_usage_check_names_turns_that_could_not_be_fitted():
    from loadgen.plan.prompts import usage_check
    lengths = {"exact": True, "asked_approximate": False, "reason": None, "turns_impossible": 2}
    usage_check(lengths, [(100, 100), (120, 124), (130, 133)])
    assert not lengths["exact"] and lengths["usage"] == {"compared": 3, "equal": 1, "max_abs_error": 4}
    assert lengths["reason"].endswith("; 2 session turns could not be fitted: their history alone (chat template "
                                      "included) counted more than planned")
