"""Unit tests: the sim's fault SPEC parser and its tokenizer."""
from __future__ import annotations

import pytest

from loadgen.sim import tokenizer
from loadgen.sim.faults import Stall, parse_faults, stall_overlap_ns


def test_full_spec_parses():
    plan = parse_faults("http500=0.1,http429=0.05,http503=0.05,reset_after=5:0.05,stall=2s@10s,"
                        "malformed=0.02,slow_headers=200ms:0.1,stall=1s@30s", seed=7)
    kinds = [(f.kind, p) for f, p in plan.per_request]
    assert kinds == [("http500", 0.1), ("http429", 0.05), ("http503", 0.05), ("reset_after", 0.05),
                     ("malformed", 0.02), ("slow_headers", 0.1)]
    assert plan.per_request[3][0].after_tokens == 5
    assert plan.per_request[5][0].delay_ns == 200_000_000
    assert plan.stalls == [Stall(10_000_000_000, 2_000_000_000), Stall(30_000_000_000, 1_000_000_000)]


@pytest.mark.parametrize("spec, needle", [
    ("bogus=1", "'bogus=1'"), ("http500", "'http500'"), ("http500=x", "'x'"),
    ("http500=1.5", "1.5"), ("reset_after=5", "K:P"), ("reset_after=a:0.1", "whole number"),
    ("slow_headers=200:0.1", "unit"), ("stall=2s", "S@T"), ("http500=0.6,http503=0.6", "sum"),
    ("http500=0.1,,", "empty"),
])
def test_bad_specs_name_the_bad_part(spec, needle):
    with pytest.raises(ValueError) as e:
        parse_faults(spec)
    assert needle in str(e.value)


def test_fault_choice_is_a_function_of_seed_and_request_id():
    plan = parse_faults("http500=0.3,reset_after=2:0.3", seed=1)
    picks = [plan.for_request(f"r{i}") for i in range(2000)]
    assert picks == [plan.for_request(f"r{i}") for i in range(2000)]
    n500 = sum(1 for f in picks if f and f.kind == "http500")
    nreset = sum(1 for f in picks if f and f.kind == "reset_after")
    assert 500 < n500 < 700 and 500 < nreset < 700  # 600 expected each; ~20 sd
    other = parse_faults("http500=0.3,reset_after=2:0.3", seed=2)
    assert picks != [other.for_request(f"r{i}") for i in range(2000)]


def test_fixed_mode_stall_stops_the_request_clock():
    s = [Stall(start_ns=100, duration_ns=50)]
    assert stall_overlap_ns(s, 0, 0, 99) == 0  # due before the stall
    assert stall_overlap_ns(s, 0, 0, 100) == 50  # due at its start: pushed past it
    assert stall_overlap_ns(s, 0, 0, 500) == 50
    assert stall_overlap_ns(s, 0, 120, 200) == 30  # arrived mid-stall: only the rest
    assert stall_overlap_ns(s, 0, 150, 200) == 0  # arrived after


def test_tokenizer_rule_and_ids():
    assert tokenizer.words("Hello,  world!\n\tx ") == ["Hello,", "world!", "x"]
    assert tokenizer.count_tokens("") == 0 and tokenizer.count_tokens("  a  ") == 1
    ids = tokenizer.encode("the cat the")
    assert ids[0] == ids[2] != ids[1] and all(0 <= i < tokenizer.VOCAB_SIZE for i in ids)
    assert tokenizer.token_id("the") == 85086  # pins the documented BLAKE2b rule
    assert tokenizer.decode(ids) == "the cat the"
    assert tokenizer.count_tokens(tokenizer.OUTPUT_TOKEN_TEXT * 7) == 7
    msgs = [{"role": "system", "content": "a b"}, {"role": "user", "content": [{"type": "text", "text": "c"}]}]
    assert tokenizer.count_tokens(tokenizer.chat_prompt_text(msgs)) == 3
    with pytest.raises(ValueError):
        tokenizer.chat_prompt_text([])
