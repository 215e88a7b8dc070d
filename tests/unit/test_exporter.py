"""--metrics-port's exposition (loadgen/run/exporter.py) from a synthetic Snapshot, through the Exporter's
HTTP server on a free loopback port: the text parses with prometheus_client's parser, the names and labels
are the documented ones, the buckets are cumulative and end at the count, no credential of the target
shows, the run's end is marked, and a bad port or host is a ConfigError naming the flag."""
import io
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadgen.config.workload import ConfigError
from loadgen.run import exporter as exporter_module
from loadgen.run.exporter import HISTOGRAMS, LABELS, Exporter, families
from loadgen.run.live import BUCKETS_S, Buckets, Feed, Snapshot, Window

NAMES = {"loadgen_requests_due", "loadgen_requests_sent", "loadgen_requests_finished", "loadgen_output_tokens",
         "loadgen_requests_in_flight", "loadgen_requests_planned", "loadgen_loop_lateness_p99_seconds",
         "loadgen_run_elapsed_seconds", "loadgen_run_ended", *HISTOGRAMS.values()}
SECRET_URL = "https://alice:hunter2-very-secret@gpu.example:8443/v1?api_key=sk-abcdef0123456789"


def snapshot(t_s: float = 4.0) -> Snapshot:
    buckets = {}
    for m, upper in BUCKETS_S.items():   # 5 samples per metric, 2 of them above every bound but the last
        cumulative = tuple(0 if i < 3 else (3 if i < len(upper) - 1 else 5) for i in range(len(upper)))
        buckets[m] = Buckets(upper, cumulative, 6, 1.25)
    w = Window(6, 10.0, 20.0, 30.0)
    return Snapshot(t_s=t_s, interval_s=1.0, planned=10, due=9, sent=8, in_flight=1,
                    outcomes={"ok": 5, "timeout": 2}, output_tokens=123, last={"ttft": w}, run={"ttft": w},
                    buckets=buckets, loop_lateness_p99_ms=2.5)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return r.read().decode()


@pytest.fixture
def exporter():
    e = Exporter("127.0.0.1", 0, progress=None)
    yield e
    e.close(linger=False)


def test_the_exposition_parses_with_the_documented_names_labels_and_buckets(exporter):
    feed = Feed()
    exporter.expose(feed, rate="8")
    assert exporter.port > 0 and scrape(exporter.url) == ""   # nothing before the run's first Snapshot
    feed.describe(run_id="ab12", workload="chat", target=SECRET_URL, model="m1")
    feed.publish(snapshot())
    text = scrape(exporter.url)
    for leak in ("alice", "hunter2", "api_key", "sk-abc"):
        assert leak not in text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(fams) == NAMES
    assert {f.type for n, f in fams.items() if n in HISTOGRAMS.values()} == {"histogram"}
    assert fams["loadgen_requests_sent"].type == "counter" and fams["loadgen_requests_in_flight"].type == "gauge"
    want = {"run_id": "ab12", "workload": "chat", "target": "https://gpu.example:8443/v1", "model": "m1",
            "rate": "8"}
    for f in fams.values():
        for s in f.samples:
            extra = {"outcome"} if f.name == "loadgen_requests_finished" else {"le"} if s.name.endswith(
                "_bucket") else set()
            assert {k: v for k, v in s.labels.items() if k not in extra} == want, s
    value = {s.name: s.value for f in fams.values() for s in f.samples if not s.labels.keys() - set(want)}
    assert value["loadgen_requests_due_total"] == 9 and value["loadgen_requests_sent_total"] == 8
    assert value["loadgen_output_tokens_total"] == 123 and value["loadgen_requests_in_flight"] == 1
    assert value["loadgen_loop_lateness_p99_seconds"] == 0.0025 and value["loadgen_run_ended"] == 0
    finished = {s.labels["outcome"]: s.value for s in fams["loadgen_requests_finished"].samples}
    assert finished == {"ok": 5, "timeout": 2}
    for m, name in HISTOGRAMS.items():
        b = [(float(s.labels["le"]), s.value) for s in fams[name].samples if s.name == name + "_bucket"]
        assert [le for le, _ in b] == [*BUCKETS_S[m], float("inf")]
        assert all(x <= y for (_, x), (_, y) in zip(b, b[1:])) and b[-1][1] == 6
        assert value[name + "_count"] == 6 and value[name + "_sum"] == 1.25
    feed.close()   # the run ended: its figures stay, marked final
    ended = [s for f in text_string_to_metric_families(scrape(exporter.url)) for s in f.samples
             if s.name == "loadgen_run_ended"]
    assert [s.value for s in ended] == [1]


def test_every_run_of_the_command_keeps_its_series(exporter):
    feeds = [Feed(), Feed()]
    for k, feed in enumerate(feeds):
        exporter.expose(feed, rate=str(k + 1))
        feed.describe(run_id=f"r{k}", workload="w", target="http://127.0.0.1:1", model="m")
        feed.publish(snapshot())
    feeds[0].close()
    sent = [s for f in text_string_to_metric_families(scrape(exporter.url)) for s in f.samples
            if s.name == "loadgen_requests_sent_total"]
    assert sorted((s.labels["run_id"], s.labels["rate"]) for s in sent) == [("r0", "1"), ("r1", "2")]


def test_a_run_without_a_planned_count_or_lateness_leaves_those_gauges_out():
    s = snapshot()
    s = Snapshot(**{**s.__dict__, "planned": None, "loop_lateness_p99_ms": None})
    names = {f.name for f in families([(dict.fromkeys(LABELS, ""), s, False)])}
    assert "loadgen_requests_planned" not in names and "loadgen_loop_lateness_p99_seconds" not in names
    assert families([]) == []


def test_other_paths_are_404(exporter):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(exporter.url.replace("/metrics", "/"), timeout=10)
    assert e.value.code == 404


def test_close_waits_for_a_scrape_after_the_end():
    e = Exporter("127.0.0.1", 0, progress=None)
    scrape(e.url)
    scrape(e.url)   # two scrapes: the linger is sized by their gap
    came = []
    closer = threading.Thread(target=lambda: came.append(e.close()))
    closer.start()
    while closer.is_alive():   # the server is up until a scrape begun after the end came
        try:
            scrape(e.url)
        except OSError:
            break              # stopped between the check and the scrape
    closer.join(30)
    assert came == [True]
    with pytest.raises(OSError):
        scrape(e.url)   # stopped


def test_close_waits_until_the_last_scrape_is_answered(monkeypatch):
    """The linger ends on a scrape's answer written, not on its start: the command's process exits right
    after close(), and its daemon threads with it, so an answer still being rendered would be cut off (CI:
    Prometheus never saw loadgen_run_ended = 1)."""
    progress = io.StringIO()
    e = Exporter("127.0.0.1", 0, progress=progress)
    scrape(e.url)
    scrape(e.url)
    e._scrape_starts.appendleft(e._scrape_starts[0] - 10)   # as if 10 s apart: the linger is 21 s, not ~1 s
    release, real = threading.Event(), exporter_module.generate_latest
    monkeypatch.setattr(exporter_module, "generate_latest", lambda reg: (release.wait(30), real(reg))[1])
    came, answers = [], []
    closer = threading.Thread(target=lambda: came.append(e.close()))
    closer.start()
    while "waiting up to" not in progress.getvalue():   # close() has taken the end's time
        time.sleep(0.01)
    scraper = threading.Thread(target=lambda: answers.append(scrape(e.url)))
    scraper.start()
    while len(e._scrape_starts) < 4:                      # that scrape began (after the end) ...
        time.sleep(0.01)
    time.sleep(1.0)                                       # > serve_forever's 0.5 s poll: a shutdown would end
    assert closer.is_alive() and not answers             # ... and is not answered yet: close() still waits
    release.set()
    closer.join(30)
    scraper.join(30)
    assert came == [True] and len(answers) == 1


def test_close_without_a_scrape_after_the_end_says_so(monkeypatch):
    e = Exporter("127.0.0.1", 0, progress=None)
    scrape(e.url)   # one scrape, then none: the linger runs out (LINGER_ONE_SCRAPE_S)
    monkeypatch.setattr(exporter_module, "LINGER_ONE_SCRAPE_S", 0.2)
    assert e.close() is False
    assert Exporter("127.0.0.1", 0, progress=None).close() is True   # nothing scraped: nothing awaited


def test_a_port_in_use_or_a_bad_host_names_the_flag():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError) as e:
            Exporter("127.0.0.1", port, progress=None)
        assert e.value.problems[0].startswith(f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}")
    with pytest.raises(ConfigError) as e:
        Exporter("no such host.invalid", 0, progress=None)
    assert e.value.problems[0].startswith("--metrics-host 'no such host.invalid'")
