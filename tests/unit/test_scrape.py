"""Prometheus text parsing (scrape.py) and the histogram cross-check (decompose.histogram_crosscheck)."""
import pytest

from loadgen.analysis.decompose import histogram_crosscheck
from loadgen.probe import scrape
from loadgen.probe.scrape import frame, parse

TEXT = '''# HELP vllm:num_requests_waiting Waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m",engine="0"} 3.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m",engine="0"} 7.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{le="0.1",model_name="m",engine="0"} 1.0
vllm:request_queue_time_seconds_bucket{le="+Inf",model_name="m",engine="0"} 2.0
vllm:request_queue_time_seconds_count{model_name="m",engine="0"} {count}
vllm:request_queue_time_seconds_sum{model_name="m",engine="0"} {sum}
'''


def text(count: float, total: float) -> str:
    return TEXT.replace("{count}", str(count)).replace("{sum}", str(total))


def test_parse_keeps_every_sample_with_canonical_labels():
    rows = parse(text(2, 0.3), 5)
    names = [r[1] for r in rows]
    assert "vllm:num_preemptions_total" in names and "vllm:request_queue_time_seconds_bucket" in names
    waiting = [r for r in rows if r[1] == "vllm:num_requests_waiting"][0]
    assert waiting == (5, "vllm:num_requests_waiting", 'engine="0",model_name="m"', 3.0)


def test_parse_rejects_what_is_not_the_text_format():
    with pytest.raises(ValueError):
        parse("this is { not prometheus\n", 0)


def test_histogram_deltas_give_mean_times():
    # 2 -> 12 requests, 0.3 -> 1.3 s of queueing over the run: mean 100 ms
    df = frame(parse(text(2, 0.3), 0) + parse(text(12, 1.3), 10**9))
    assert histogram_crosscheck(df) == {"queue": pytest.approx(100.0), "n": 10}
    assert histogram_crosscheck(frame(parse(text(2, 0.3), 0))) is None  # no requests in between


@pytest.mark.parametrize("text, expected", [
    # summed over label sets (two engines), a label value holding "}" and spaces, a timestamp after the value
    ('vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
     'vllm:num_requests_running{engine="1",model_name="a } b"} 2.0\n'
     'vllm:num_requests_waiting 7 1700000000000\nvllm:kv_cache_usage_perc{engine="0"} 0.25\n',
     {"running": 5.0, "waiting": 7.0, "kv_usage": 0.25}),
    # a longer name with the same prefix, HELP/TYPE lines and a name inside another's labels are not samples
    ('# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n'
     'vllm:num_requests_running_total 9\nother{of="vllm:num_requests_waiting"} 4\n'
     'vllm:num_requests_running 1\n', {"running": 1.0}),
    ("sglang:num_running_reqs 2\nsglang:num_queue_reqs 6\nsglang:token_usage 0.5\n",
     {"running": 2.0, "waiting": 6.0, "kv_usage": 0.5}),
    ("vllm:gpu_cache_usage_perc 0.75\n", {"kv_usage": 0.75}),   # vLLM V0's name
    ("vllm:num_requests_running NaNx\n", {}),                   # a value that is not a number: left out
    ("", {}),
])
def test_live_gauges_are_read_by_search_from_the_latest_text(text, expected):
    assert scrape.gauges(text) == expected


def test_a_scrape_in_flight_when_the_sampler_stops_is_read_not_dropped():
    # The run stops its samplers when the load ends. A scrape the endpoint had answered but the client had not
    # read yet was cancelled, and the sample lost (beside two CPU burners, a telemetry run recorded 13 of the 14
    # scrapes its exporter served). Here the endpoint answers 300 ms after each request; the sampler is stopped
    # while its second scrape waits: it ends once that answer is read, and every answer served is recorded.
    import asyncio

    from aiohttp import web

    served: list[int] = []

    async def metrics(request):
        await asyncio.sleep(0.3)
        served.append(len(served))
        return web.Response(text=f"up {len(served)}\n")

    async def go():
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            sc = scrape.Scraper(f"http://127.0.0.1:{port}/metrics", 0, interval_ns=100_000_000)
            task = asyncio.create_task(sc.run())
            while len(served) < 1:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)   # the second scrape is in flight: its answer comes in ~0.2 s
            sc.stop()
            await asyncio.wait_for(task, 5)
            return sc
        finally:
            await runner.cleanup()

    sc = asyncio.run(go())
    assert len(served) == 2 and sc.scrapes == 2 and sc.errors == 0
    assert [v for *_, v in parse(sc.texts[-1][1], 0)] == [2.0]
