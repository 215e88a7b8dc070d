"""`make bench`'s regression guard (tests/bench/goals.py): each goal judged per rate against the bare client of
the same run; an error goal in each repetition (a miss in one is a miss), the CPU goal over the repetitions."""
import pytest

from tests.bench.goals import judge


def case(client, rate=400.0, rep=0, ttft=1.0, itl=0.5, cpu=10.0, kind="capacity"):
    return {"kind": kind, "client": client, "rate_per_s": rate, "rep": rep, "ttft_err_p99_ms": ttft,
            "itl_gap_err_p99_ms": itl, "cpu_us_per_chunk": cpu}


@pytest.mark.parametrize("loadgen, missed", [
    (case("loadgen", ttft=1.5, itl=1.0, cpu=13.0), []),                       # every goal met at its bound
    (case("loadgen", ttft=1.51), ["ttft_err_p99_ms"]),                        # 0.51 ms over bare
    (case("loadgen", itl=1.2), ["itl_gap_err_p99_ms"]),
    (case("loadgen", cpu=13.1), ["cpu_us_per_chunk"]),                        # 1.31x
    (case("loadgen", ttft=None), ["ttft_err_p99_ms"]),                        # not measured is a miss
])
def test_each_goal_against_the_bare_client(loadgen, missed):
    _, misses = judge([loadgen, case("bare")])
    assert [m.split(": ")[1].split()[0] for m in misses] == missed


def test_a_stall_in_one_repetition_is_a_miss_and_rates_outside_the_range_are_not_judged():
    results = [case("loadgen", rep=0), case("bare", rep=0), case("loadgen", rep=1, ttft=12.0), case("bare", rep=1),
               case("loadgen", rate=1600.0, cpu=99.0), case("bare", rate=1600.0),     # beyond 800/s
               case("loadgen", rate=50.0, cpu=99.0, kind="accuracy"), case("bare", rate=50.0, kind="accuracy"),
               case("loadgen", rate=200.0, kind="accuracy"), {**case("bare", rate=200.0), "error": "x"}]  # unpaired
    lines, misses = judge(results)
    assert len(lines) == 5 and misses == [m for m in misses if "400/s run 2" in m] and len(misses) == 1


@pytest.mark.parametrize("runs, missed", [
    ([(13.5, 10.0, 1000), (11.5, 10.0, 1000)], False),   # 1.35x and 1.15x: 1.25x over both runs
    ([(13.5, 10.0, 3000), (11.5, 10.0, 500)], True),     # the runs weigh by their chunks: 1.32x (1.25x unweighted)
    ([(13.0, 10.0, 1000), (13.0, 10.0, 1000)], False),   # at the bound
    ([(13.2, 10.0, 1000), (None, 10.0, 1000)], True),    # not measured in one run is a miss
])
def test_the_cpu_goal_is_judged_over_the_repetitions_weighted_by_chunks(runs, missed):
    results = []
    for rep, (lg, bare, chunks) in enumerate(runs):
        results += [{**case("loadgen", rep=rep, cpu=lg), "chunks": chunks},
                    {**case("bare", rep=rep, cpu=bare), "chunks": chunks}]
    lines, misses = judge(results)
    cpu = [line for line in lines if "cpu_us_per_chunk" in line]
    assert len(cpu) == 1 and bool(misses) == missed and (not missed or "cpu_us_per_chunk" in misses[0])


@pytest.mark.parametrize("cv, lag99, server, missed", [
    (1.1, 1.0, "fastmock", []),                                               # both at their bound
    (0.89, 0.2, "fastmock", ["arrival_cv_at_server"]),                        # the Poisson shape lost
    (1.04, 1.01, "fastmock", ["send_lag_p99_ms"]),
    (None, 0.2, "fastmock", ["arrival_cv_at_server"]),                        # not measured is a miss
    (2.0, 9.0, "sim", []),                                                    # the simulator: not judged
])
def test_one_core_at_2000_per_s_keeps_the_shape_and_the_send_lag(cv, lag99, server, missed):
    one_core = {"kind": "capacity", "client": "loadgen", "rate_per_s": 2000.0, "rep": 0, "server": server,
                "arrival_cv_at_server": cv, "send_lag_p99_ms": lag99}
    lines, misses = judge([one_core, {**one_core, "client": "bare", "arrival_cv_at_server": 2.0}])
    assert [m.split(": ")[1].split()[0] for m in misses] == missed
    assert len(lines) == (1 if server == "sim" else 2)
