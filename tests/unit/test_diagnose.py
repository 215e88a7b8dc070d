"""Each diagnosis rule: one case that must fire it and one that must not."""
import pytest

from loadgen.analysis import diagnose as dg
from loadgen.analysis.diagnose import Facts

MEAN = {"send_lag": 0.1, "connect": 0.1, "queue": 10.0, "prefill": 80.0, "decode": 500.0, "decode_ideal": 450.0,
        "decode_contention": 40.0, "decode_stalls": 10.0, "other": 0.5}
FLAT = [{"prompt_tokens_min": 100, "prompt_tokens_max": 200, "n": 10, "ttft_p50": 90.0, "tpot_p50": 10.0},
        {"prompt_tokens_min": 800, "prompt_tokens_max": 900, "n": 10, "ttft_p50": 100.0, "tpot_p50": 10.0}]
RISING = [dict(FLAT[0], ttft_p50=30.0), dict(FLAT[1], ttft_p50=150.0, tpot_p50=10.5)]
ROOF = {"measured_single_stream_tok_s": 40.0, "single_stream_ceiling_tok_s": 200.0, "fraction_of_ceiling": 0.2,
        "measured_from": "probes", "bandwidth": "h100-sxm (3350 GB/s)"}


def facts(**kw) -> Facts:
    base = dict(mean=dict(MEAN), ttft_mean_ms=91.0, by_prompt=FLAT, stalled_requests=0, requests=100)
    mean = base["mean"]
    mean.update(kw.pop("mean", {}))
    return Facts(**{**base, **kw})


QUEUED = {"queue": 300.0}  # with ttft_mean 400: 75 % of TTFT is queueing


@pytest.mark.parametrize("rule, fires, quiet", [
    # KV full, requests waiting, queue-dominated TTFT / the same queueing with KV at 60 %
    (dg.kv_capacity, facts(mean=QUEUED, ttft_mean_ms=400.0, max_waiting=12.0, max_kv_usage=0.99),
     facts(mean=QUEUED, ttft_mean_ms=400.0, max_waiting=12.0, max_kv_usage=0.60)),
    # queue-dominated TTFT without a full KV pool / a full KV pool (that is kv_capacity's finding)
    (dg.overload, facts(mean=QUEUED, ttft_mean_ms=400.0, max_waiting=12.0, max_kv_usage=0.60),
     facts(mean=QUEUED, ttft_mean_ms=400.0, max_waiting=12.0, max_kv_usage=0.99)),
    # 30 % of decode is prefill stalls / 2 %
    (dg.prefill_stalls, facts(mean={"decode_stalls": 150.0}, stalled_requests=60),
     facts(mean={"decode_stalls": 10.0}, stalled_requests=5)),
    # TTFT 30 -> 150 ms with length, little queueing / flat TTFT
    (dg.prefill_cost, facts(by_prompt=RISING), facts(by_prompt=FLAT)),
    # the same rising TTFT but queueing dominates: not a prefill-cost story
    (dg.prefill_cost, facts(by_prompt=RISING), facts(by_prompt=RISING, mean=QUEUED, ttft_mean_ms=400.0)),
    # 20 % of the bandwidth ceiling / 80 %
    (dg.below_ceiling, facts(roofline=ROOF), facts(roofline=dict(ROOF, fraction_of_ceiling=0.8))),
])
def test_rule_fires_and_stays_quiet(rule, fires, quiet):
    found = rule(fires)
    assert found is not None and found["rule"] == rule.__name__
    assert found["finding"] and found["remedy"] and found["evidence"]
    assert rule(quiet) is None


def test_a_healthy_run_has_no_finding():
    assert dg.diagnose(facts()) == []


def test_metrics_facts_take_the_peaks():
    from loadgen.probe.scrape import frame

    df = frame([(0, "vllm:num_requests_waiting", "", 0.0), (1, "vllm:num_requests_waiting", "", 4.0),
                (1, "vllm:kv_cache_usage_perc", "", 0.97), (2, "vllm:num_requests_running", "", 9.0)])
    assert dg.facts_from_metrics(df) == (4.0, 0.97)
    assert dg.facts_from_metrics(None) == (None, None)


def test_the_overload_remedy_names_a_command_that_exists():
    # the remedy used to recommend `loadgen sweep`, which did not exist. The command it names
    # now must parse with loadgen's own parser (a sweep from 1/s to the knee).
    import shlex

    from loadgen.cli.main import build_parser

    finding = dg.overload(Facts(mean={"queue": 80.0}, ttft_mean_ms=100.0, by_prompt=[]))
    assert dg.SWEEP_COMMAND in finding["remedy"]
    argv = shlex.split(dg.SWEEP_COMMAND)
    assert argv[0] == "loadgen"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "sweep" and args.start == "1/s" and args.refine == "3"
