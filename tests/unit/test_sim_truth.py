"""The sim's truth rows: the ns identity, and both file formats."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from loadgen.sim.truth import COLUMNS, TruthWriter, journal_path, make_row, read_truth

REQUIRED = ["request_id", "arrival_ns", "scheduled_ns", "first_token_ns", "finish_ns", "queue_s",
            "prefill_s", "decode_s", "preemptions", "stall_s", "token_ns"]


def row(arrival, q, p, gaps, rid="r"):
    tokens = [arrival + q + p]
    for g in gaps:
        tokens.append(tokens[-1] + g)
    return make_row(request_id=rid, arrival_ns=arrival, scheduled_ns=arrival + q, first_token_ns=tokens[0],
                    finish_ns=tokens[-1], preemptions=0, stall_ns=0, token_ns=tokens,
                    lateness_ns=[0] * len(tokens), speed=0.5, mode="engine", endpoint="completions",
                    http_status=200, outcome="ok", fault="", prompt_tokens=3)


ns = st.integers(min_value=0, max_value=10**12)


@given(ns, ns, ns, st.lists(ns, max_size=20))
def test_arrival_plus_queue_prefill_decode_is_finish_exactly(arrival, q, p, gaps):
    r = row(arrival, q, p, gaps)
    assert r["arrival_ns"] + r["queue_ns"] + r["prefill_ns"] + r["decode_ns"] == r["finish_ns"]
    assert r["queue_s"] == r["queue_ns"] / 1e9 and r["decode_s"] == r["decode_ns"] / 1e9


def test_both_formats_round_trip_with_the_contract_columns(tmp_path):
    assert all(c in COLUMNS for c in REQUIRED)
    rows = [row(10, 1, 2, [3, 4], "a"), row(20, 0, 5, [], "b")]
    for name in ("t.jsonl", "t.parquet"):
        w = TruthWriter(tmp_path / name)
        for r in rows:
            w.add(r)
        w.close()
        back = read_truth(tmp_path / name)
        assert [b["request_id"] for b in back] == ["a", "b"]
        assert back[0]["token_ns"] == [13, 16, 20] and back[0]["speed"] == 0.5
        assert set(REQUIRED) <= set(back[0])


def test_parquet_truth_is_journaled_while_running_and_written_at_close(tmp_path):
    # Rewriting a parquet file on every request would stall the simulator's loop: rows are journaled
    # (readable at once, and after a kill), and the parquet file appears at close.
    path = tmp_path / "t.parquet"
    w = TruthWriter(path)
    w.add(row(10, 1, 2, [3], "a"))
    assert not path.exists() and [r["request_id"] for r in read_truth(path)] == ["a"]
    with open(journal_path(path), "ab") as f:  # a line cut by a kill is skipped
        f.write(b'{"request_id": "cu')
    assert [r["request_id"] for r in read_truth(path)] == ["a"]
    w.add(row(20, 1, 2, [3], "b"))
    w.close()
    assert path.exists() and not journal_path(path).exists()
    assert [r["request_id"] for r in read_truth(path)] == ["a", "b"]


def test_shared_writers_append_to_one_journal_the_parent_finishes(tmp_path):
    # --processes N: the parent empties the journal, N writers append rows whole, the parent writes the
    # parquet file once they are done; readers see one file, every row once.
    from loadgen.sim.truth import finish_shared, start_shared

    for name in ("t.jsonl", "t.parquet"):
        path = tmp_path / name
        start_shared(path)
        writers = [TruthWriter(path, shared=True) for _ in range(2)]
        for i in range(6):
            writers[i % 2].add({**row(10 * i, 1, 2, [3] * 300, f"r{i}"), "sim_process": i % 2})
        assert sorted(r["request_id"] for r in read_truth(path)) == [f"r{i}" for i in range(6)]  # live
        for w in writers:
            w.close()
        assert name == "t.jsonl" or not path.exists()  # the parquet file is the parent's to write
        finish_shared(path)
        back = read_truth(path)
        assert sorted(r["request_id"] for r in back) == [f"r{i}" for i in range(6)]
        assert sorted(r["sim_process"] for r in back) == [0, 0, 0, 1, 1, 1]
        assert not journal_path(path).exists()
