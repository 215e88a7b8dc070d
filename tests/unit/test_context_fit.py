"""plan/context.py on a multi-turn plan: a dropped turn takes the rest of its conversation with it, and
a clipped turn shortens the history every later turn of its conversation is planned on."""
from pathlib import Path

import numpy as np
import pytest

from loadgen.config import workload as config
from loadgen.config.workload import ConfigError, with_overrides
from loadgen.plan.schedule import NONE, build

W = Path(__file__).resolve().parents[2] / "workloads" / "multi-turn-chat.toml"


def _limited(policy: str, limit: int):
    base = config.load(W)
    return build(base), build(with_overrides(base, "test", over_context=policy, context_limit=limit,
                                             context_source="test limit"))


def _limit(s, percentile: float = 60) -> int:
    return int(np.percentile(s.prompt_tokens + s.max_tokens, percentile))


def test_drop_takes_the_rest_of_the_conversation_and_renumbers_after():
    plain = build(config.load(W))
    limit = _limit(plain)
    _, s = _limited("drop", limit)
    assert (s.prompt_tokens + s.max_tokens).max() <= limit
    info = s.info["context"]
    assert info["dropped"] == len(plain) - len(s) >= info["over"] > 0
    later = np.flatnonzero(s.after != NONE)
    assert (s.session[s.after[later]] == s.session[later]).all()   # every kept turn follows its own previous
    assert (s.turn[s.after[later]] == s.turn[later] - 1).all()


def test_clip_shortens_later_turns_by_the_earlier_cuts():
    plain = build(config.load(W))
    limit = int((plain.prompt_tokens + plain.max_tokens).max()) - 50
    _, s = _limited("clip", limit)
    assert s.info["context"]["clipped"] > 0
    assert len(s) == len(plain) and (s.prompt_tokens + s.max_tokens).max() <= limit
    for r in np.flatnonzero(s.after != NONE).tolist():  # each turn's plan = previous prompt + reply + own text
        p = int(s.after[r])
        assert s.prompt_tokens[r] == s.prompt_tokens[p] + s.max_tokens[p] + s.new_tokens[r]


def test_a_history_alone_over_the_limit_cannot_be_clipped():
    with pytest.raises(ConfigError, match=r"(?s)cannot be clipped to .* \(conversation \d+, turn \d+\)"):
        _limited("clip", _limit(build(config.load(W)), 60))


def test_error_names_conversation_and_turn():
    plain = build(config.load(W))
    with pytest.raises(ConfigError) as e:
        _limited("error", _limit(plain))
    text = str(e.value)
    assert "do not fit the target's context of" in text and "(conversation " in text and "test limit" in text
