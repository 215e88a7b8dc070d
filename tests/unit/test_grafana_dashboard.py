"""docs/grafana/loadgen-vllm.json loads as a Grafana dashboard and every query names only metrics that exist:
loadgen's as the exporter (run/exporter.py) exposes them, vLLM's as the simulator's /metrics (which mimics
vLLM V1's names) exposes them. Client panels sit on the left, the server's on the right."""
import json

from prometheus_client.parser import text_string_to_metric_families

from loadgen.run.exporter import LABELS, families
from loadgen.sim.metrics import SimMetrics
from tests.grafana import DASHBOARD, metric_names, queries
from tests.unit.test_exporter import snapshot


def exposed(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_extractor_finds_names_and_skips_functions_labels_and_ranges():
    assert metric_names('histogram_quantile(0.5, sum by (le, run_id) (rate(a_bucket{x=~"b|c"}[1m])))') == {
        "a_bucket"}
    assert metric_names('sum(vllm:num_requests_running{model_name=~".*"}) / on (x) b') == {
        "vllm:num_requests_running", "b"}


def test_every_query_names_an_existing_metric():
    loadgen = {s.name for f in families([(dict.fromkeys(LABELS, ""), snapshot(), False)]) for s in f.samples}
    vllm = exposed(SimMetrics("m", 1.0).render())
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["panels"] and dash["templating"]["list"]
    seen = set()
    for title, expr in queries():
        names = metric_names(expr)
        assert names, f"{title}: {expr} reads no metric"
        for n in names:
            assert n in (vllm if n.startswith("vllm:") else loadgen), f"{title}: {n} is not exposed ({expr})"
        seen |= names
    assert {n for n in seen if n.startswith("loadgen_")} and {n for n in seen if n.startswith("vllm:")}
    for p in dash["panels"]:   # side by side: the client's panels left, the server's right
        side = {n.split("_")[0].split(":")[0] for _, e in [(0, t["expr"]) for t in p["targets"]]
                for n in metric_names(e)}
        assert side == ({"loadgen"} if p["gridPos"]["x"] == 0 else {"vllm"}), p["title"]
