"""The GPU telemetry summary's maths (loadgen/analysis/telemetry.py) on hand-made telemetry.parquet frames,
and the `--scrape` / `run.scrape` option's checks (loadgen/config/kinds.py ENDPOINTS)."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from loadgen.analysis.telemetry import FP64_BLANK, INT64_BLANK, counter_increase, section
from loadgen.config import workload as config
from loadgen.config.workload import ConfigError
from loadgen.probe.scrape import TELEMETRY_SCHEMA
from tests.unit.test_config import GOOD, write

S = 1_000_000_000
SRC = "http://gpu-host:9400/metrics"
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total"


def labels(gpu: str, uuid: str | None = None, extra: str = "") -> str:
    uuid = uuid or f"GPU-{gpu}"
    return f'DCGM_FI_DRIVER_VERSION="550.90.07",Hostname="n1",UUID="{uuid}",device="nvidia{gpu}",gpu="{gpu}"' \
           f',modelName="NVIDIA H100 80GB HBM3"{extra}'


def frame(rows: list[tuple[float, str, str, float]], source: str = SRC) -> pl.DataFrame:
    # rows: (t_s, name, labels, value)
    return pl.DataFrame([(int(t * S), source, n, lab, float(v)) for t, n, lab, v in rows],
                        schema=TELEMETRY_SCHEMA, orient="row")


@pytest.mark.parametrize("t_s,values,start_s,end_s,expected", [
    # linear: 1000 mJ per s over [0.5, 2.5] -> 2000 mJ, interpolated between the scrapes at 0, 1, 2, 3
    ([0, 1, 2, 3], [0, 1000, 2000, 3000], 0.5, 2.5, 2000.0),
    # uneven steps: the window's ends fall inside steps
    ([0, 1, 2], [10, 110, 1110], 0.5, 1.5, 50 + 500),
    # a reset (exporter or GPU restart): the drop counts from 0, 900 -> 100 is +100
    ([0, 1, 2, 3], [800, 900, 100, 300], 0, 3, 100 + 100 + 200),
    # the window exactly on the scrapes
    ([0, 1], [5, 7], 0, 1, 2.0),
    # not bracketed: no sample before the start, after the end, or a single sample
    ([1, 2, 3], [0, 1, 2], 0.5, 2, None),
    ([0, 1, 2], [0, 1, 2], 0.5, 2.5, None),
    ([0], [0], 0, 0, None),
])
def test_counter_increase(t_s, values, start_s, end_s, expected):
    got = counter_increase(np.array(t_s, dtype=np.float64) * S, np.array(values, dtype=np.float64),
                           start_s * S, end_s * S)
    assert got == (pytest.approx(expected, rel=1e-12) if expected is not None else None)


def two_gpus() -> pl.DataFrame:
    rows = []
    for k, t in enumerate((-0.1, 0.5, 1.0, 1.5, 2.2)):   # scrapes; the window below is [0, 2]
        for gpu, power, util in (("0", 400.0 + 10 * k, 10 * k), ("1", 300.0, 50)):
            lab = labels(gpu)
            rows += [(t, "DCGM_FI_DEV_POWER_USAGE", lab, power), (t, "DCGM_FI_DEV_GPU_UTIL", lab, util),
                     (t, "DCGM_FI_DEV_FB_USED", lab, 1000.0 if gpu == "0" else 500.0),
                     (t, "DCGM_FI_DEV_GPU_TEMP", lab, 40 + k), (t, "DCGM_FI_DEV_SM_CLOCK", lab, 1980),
                     (t, ENERGY, lab, 1e9 + 1000 * t * (2 if gpu == "0" else 1) * 1000),  # 2000 / 1000 W
                     (t, "DCGM_FI_DEV_MEMORY_TEMP", lab, INT64_BLANK + 2),   # not summarised
                     (t, "node_cpu_seconds_total", 'cpu="0",mode="idle"', 5.0)]
    return frame(rows)


def test_per_gpu_and_overall_figures_over_the_window():
    s = section(two_gpus(), 0, 2 * S, output_tokens=12_000)
    assert s is not None and s["window_s"] == [0.0, 2.0]
    g0, g1 = s["gpus"]
    assert (g0["gpu"], g0["uuid"], g0["model"], g0["hostname"], g0["source"]) == \
        ("0", "GPU-0", "NVIDIA H100 80GB HBM3", "n1", SRC)
    # the scrapes at 0.5, 1.0, 1.5 are inside [0, 2]: k = 1, 2, 3
    assert g0["power_w"] == {"mean": 420.0, "max": 430.0, "n": 3}
    assert g0["gpu_util_pct"] == {"mean": 20.0, "max": 30.0, "n": 3}
    assert g1["power_w"] == {"mean": 300.0, "max": 300.0, "n": 3}
    assert g0["gpu_temp_c"] == {"mean": 42.0, "max": 43.0, "n": 3}
    assert g0["sm_active"] == {"mean": None, "max": None, "n": 0}        # not exported: null, not 0
    assert g0["energy_j"] == pytest.approx(4000.0) and g1["energy_j"] == pytest.approx(2000.0)
    o = s["overall"]
    assert o["gpus"] == 2
    assert o["power_w"] == {"mean": 720.0, "max": 730.0, "n": 6}        # the node's total
    assert o["memory_used_mib"] == {"mean": 1500.0, "max": 1500.0, "n": 6}
    assert o["gpu_util_pct"] == {"mean": 35.0, "max": 50.0, "n": 6}      # over every GPU's samples
    assert o["sm_clock_mhz"]["max"] == 1980
    assert o["energy_j"] == pytest.approx(6000.0)
    assert o["output_tokens"] == 12_000 and o["output_tokens_per_j"] == pytest.approx(2.0)


def test_blank_values_are_not_figures():
    lab = labels("0")
    rows = [(t, "DCGM_FI_DEV_POWER_USAGE", lab, FP64_BLANK if t == 1 else 100.0) for t in (0, 1, 2)]
    rows += [(t, "DCGM_FI_DEV_SM_CLOCK", lab, INT64_BLANK + 4) for t in (0, 1, 2)]   # NOT_SUPPORTED
    rows += [(t, "DCGM_FI_PROF_SM_ACTIVE", lab, 0.25) for t in (0, 1, 2)]
    s = section(frame(rows), 0, 2 * S, 10)
    g = s["gpus"][0]
    assert g["power_w"] == {"mean": 100.0, "max": 100.0, "n": 2}
    assert g["sm_clock_mhz"]["n"] == 0 and g["sm_active"]["mean"] == 0.25
    # no energy counter: no energy, no tokens per joule
    assert g["energy_j"] is None and s["overall"]["energy_j"] is None and s["overall"]["output_tokens_per_j"] is None


def test_gpus_are_told_apart_by_endpoint_and_uuid_and_mig_instances_combine():
    a = [(t, "DCGM_FI_DEV_FB_USED", labels("0", extra=f',GPU_I_ID="{i}"'), 100.0 * (i + 1))
         for t in (0, 1) for i in range(3)]              # three MIG instances of one GPU: memory summed
    a += [(t, "DCGM_FI_DEV_GPU_UTIL", labels("0", extra=f',GPU_I_ID="{i}"'), 10.0 * i)
          for t in (0, 1) for i in range(3)]
    b = [(t, "DCGM_FI_DEV_FB_USED", labels("0", uuid="GPU-other"), 50.0) for t in (0, 1)]   # gpu 0 of another host
    s = section(pl.concat([frame(a), frame(b, source="http://other:9400/metrics")]), 0, S, 0)
    assert [g["uuid"] for g in s["gpus"]] == ["GPU-0", "GPU-other"]
    assert s["gpus"][0]["memory_used_mib"] == {"mean": 600.0, "max": 600.0, "n": 2}
    assert s["gpus"][0]["gpu_util_pct"]["max"] == 20.0                  # the busiest instance
    assert s["overall"]["memory_used_mib"]["mean"] == 650.0             # the GPUs' total
    assert s["overall"]["memory_used_mib"]["max"] == 650.0              # each endpoint's largest sum, added


def test_one_gpu_without_energy_leaves_the_total_null():
    rows = [(t, ENERGY, labels("0"), 1000.0 * t) for t in (0, 1, 2)]
    rows += [(t, "DCGM_FI_DEV_POWER_USAGE", labels("1"), 90.0) for t in (0, 1, 2)]
    s = section(frame(rows), 0, 2 * S, 500)
    assert s["gpus"][0]["energy_j"] == pytest.approx(2.0) and s["gpus"][1]["energy_j"] is None
    assert s["overall"]["energy_j"] is None      # a part of the node's energy would overstate tokens/J


def test_no_file_no_section_and_no_window_no_figures():
    assert section(None, 0, S, 0) is None
    s = section(two_gpus(), None, None, 0)      # a run without a finished request
    assert s["window_s"] is None and s["gpus"][0]["power_w"]["n"] == 0 and s["gpus"][0]["energy_j"] is None
    assert section(frame([(0, "node_load1", "", 0.5)]), 0, S, 0) == {
        "window_s": [0.0, 1.0], "gpus": [], "overall": {
            "gpus": 0, **{k: {"mean": None, "max": None, "n": 0} for k in
                          ("gpu_util_pct", "sm_active", "memory_used_mib", "power_w", "sm_clock_mhz", "gpu_temp_c")},
            "energy_j": None, "output_tokens": 0, "output_tokens_per_j": None}, "nodes": []}


def test_node_exporter_cpu_busy_share():
    # two cpus over [0, 2] s: cpu0 3/4 busy (user 1.5 s, idle 0.5 s), cpu1 1/4 busy (system 0.25, iowait
    # 0.25 counted idle, idle 1.5); sampled at -1, 1, 3 s with constant rates
    rates = {("0", "user"): 0.75, ("0", "idle"): 0.25, ("1", "system"): 0.125, ("1", "iowait"): 0.125,
             ("1", "idle"): 0.75}
    rows = [(t, "node_cpu_seconds_total", f'cpu="{c}",mode="{m}"', 1000 + r * t)
            for t in (-1, 1, 3) for (c, m), r in rates.items()]
    s = section(frame(rows, source="http://n:9100/metrics"), 0, 2 * S, 0)
    assert s["gpus"] == []
    (node,) = s["nodes"]
    assert node["source"] == "http://n:9100/metrics" and node["cpus"] == 2
    assert node["cpu_busy"] == pytest.approx((1.5 + 0.25) / 4, rel=1e-12)
    late = section(frame([r for r in rows if r[0] > 0], source="http://n:9100/metrics"), 0, 2 * S, 0)
    assert late["nodes"][0]["cpu_busy"] is None          # no sample before the window: not a part of it


def test_the_workload_key_is_a_list_of_urls(tmp_path):
    good = GOOD.replace("[run]", '[run]\nscrape = ["http://gpu-host:9400", "https://n:9100/metrics"]')
    c = config.load(write(tmp_path, good))
    assert c.scrape == ("http://gpu-host:9400/metrics", "https://n:9100/metrics")
    # the flags replace the file's list
    assert config.load(write(tmp_path, good), {"--scrape": ["http://x:1"]}).scrape == ("http://x:1/metrics",)
    assert config.load(write(tmp_path, GOOD)).scrape == ()


@pytest.mark.parametrize("value,needle", [
    ('"http://u:topsecret@h:9400"', "run.scrape: must be a list of http(s) URLs, e.g. ['http://***@h:9400']"),
    ('["http://h:9400", 3]', "run.scrape: must be a list of http(s) URLs (non-empty strings)"),
    ('["gopher://h"]', "run.scrape: must start with http:// or https://, got 'gopher://h'"),
    ('["http://h:9400", "http://h:9400/metrics"]', "given more than once"),
])
def test_a_bad_workload_key_names_the_file_and_key(tmp_path, value, needle):
    path = write(tmp_path, GOOD.replace("[run]", f"[run]\nscrape = {value}"))
    with pytest.raises(ConfigError) as e:
        config.load(path)
    text = "\n".join(e.value.problems)
    assert needle in text and str(path) in text and "topsecret" not in text
