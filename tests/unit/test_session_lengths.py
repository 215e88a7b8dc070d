"""Issue 15 defect 9: in a conversation, [prompt] tokens is every turn's new user message, the first
one's included; the shared prefix comes on top (the shipped multi-turn-chat's first user turns were
1 token: its 300-token prefix was taken out of an 80-token median draw)."""
from pathlib import Path

import numpy as np

from loadgen.config import workload as config
from loadgen.plan.schedule import build

W = Path(__file__).resolve().parents[2] / "workloads" / "multi-turn-chat.toml"


def test_first_turn_user_message_is_drawn_like_every_other_turn():
    s = build(config.load(W))
    first, later = s.turn == 0, s.turn > 0
    assert np.all(s.prompt_tokens[first] == 300 + s.new_tokens[first])  # prefix on top of the message
    med_first, med_later = np.median(s.new_tokens[first]), np.median(s.new_tokens[later])
    assert 50 < med_first < 120 and 50 < med_later < 120, (med_first, med_later)  # lognormal median 80
    assert s.new_tokens[first].min() >= 4  # prompt.tokens min
