"""GPU telemetry over the measured window (summary.json `telemetry`), from `--scrape` endpoints' samples
(telemetry.parquet: t_ns from t0, source, name, labels, value).

The dcgm-exporter fields people read (names, units and labels as NVIDIA's dcgm-exporter exposes them: its
etc/default-counters.csv and etc/dcp-metrics-included.csv), one entry of GAUGES each, with mean and max
over the samples taken inside the measured window [first measured request due, last one done] (the
window of the summary's throughput):
    gpu_util_pct       DCGM_FI_DEV_GPU_UTIL       %
    sm_active          DCGM_FI_PROF_SM_ACTIVE     0..1 (a DCP field: exported when the CSV enables it)
    memory_used_mib    DCGM_FI_DEV_FB_USED        MiB
    power_w            DCGM_FI_DEV_POWER_USAGE    W
    sm_clock_mhz       DCGM_FI_DEV_SM_CLOCK       MHz
    gpu_temp_c         DCGM_FI_DEV_GPU_TEMP       C
and energy, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ since boot, a counter: stored with `_total`
appended, scrape.py): joules over the window = the counter linearly interpolated between scrapes at the
window's end minus at its start (a drop is a reset: the increase counts from 0, as Prometheus' increase()
does). The scrapes must bracket the window (one before its start, one after its end: the first scrape
is taken before t0 and the last after the drain), else energy is null rather than a part of it.

A node exporter's `node_cpu_seconds_total{cpu, mode}` gives `nodes`: per endpoint, the host's CPU busy
share over the window, 1 - (idle + iowait) / all modes, each series' increase taken as energy's is (null
unless bracketed).

A GPU is a distinct (source, UUID label, else gpu label); several samples of one GPU in one scrape (MIG
instances) are combined: memory summed, the other fields by max. DCGM's blank sentinels (a field the GPU
does not support: int64 >= 0x7ffffffffffffff0, fp64 >= 2**47) are not values: dropped.
`overall`: utilisation, SM activity, clock and temperature over every GPU's samples (mean of all, max of
all); power and memory as the node's total (sum of the GPUs' means; max: the largest per-scrape sum of
an endpoint's GPUs, endpoints' maxima added); energy_j the GPUs' sum (null if one lacks it) and
output_tokens_per_j = the summary's output tokens (ok measured requests, the throughput's numerator)
over it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)   # DCGM_INT64_BLANK: the lowest of DCGM's int64 sentinels
FP64_BLANK = float(2**47)                 # DCGM_FP64_BLANK = 140737488355328.0, ditto for fp64 fields


@dataclass(frozen=True)
class Gauge:
    key: str            # in summary.json
    name: str           # dcgm-exporter's metric name
    blank: float        # values at or above it are DCGM sentinels
    total: bool = False  # overall = the node's total (power, memory), else over all GPUs' samples
    label: str = ""     # for the report: the name, then its unit after the last space


GAUGES = (
    Gauge("gpu_util_pct", "DCGM_FI_DEV_GPU_UTIL", INT64_BLANK, label="GPU utilisation %"),
    Gauge("sm_active", "DCGM_FI_PROF_SM_ACTIVE", FP64_BLANK, label="SM active 0-1"),
    Gauge("memory_used_mib", "DCGM_FI_DEV_FB_USED", INT64_BLANK, total=True, label="memory used MiB"),
    Gauge("power_w", "DCGM_FI_DEV_POWER_USAGE", FP64_BLANK, total=True, label="power W"),
    Gauge("sm_clock_mhz", "DCGM_FI_DEV_SM_CLOCK", INT64_BLANK, label="SM clock MHz"),
    Gauge("gpu_temp_c", "DCGM_FI_DEV_GPU_TEMP", INT64_BLANK, label="temperature C"),
)
NODE_CPU = "node_cpu_seconds_total"              # node exporter: s per cpu and mode, a counter
IDLE_MODES = ("idle", "iowait")
ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"   # mJ, int64
ENERGY_NAMES = (ENERGY + "_total", ENERGY)        # as stored (the parser appends _total), as exposed
_LABELS = {"gpu": "gpu", "uuid": "UUID", "model": "modelName", "hostname": "Hostname"}


def gpu_samples(tel: pl.DataFrame) -> pl.DataFrame:
    """The DCGM rows of telemetry.parquet, blanks dropped, one value per (GPU, scrape, field): columns
    t_ns, source, gpu_key, gpu, uuid, model, hostname, name (the gauge's or ENERGY), value."""
    blanks = {g.name: g.blank for g in GAUGES} | {n: INT64_BLANK for n in ENERGY_NAMES}
    m = tel.filter(pl.col("name").is_in(list(blanks)))
    m = m.with_columns(
        pl.col("name").replace({ENERGY + "_total": ENERGY}),
        pl.col("name").replace_strict(blanks, return_dtype=pl.Float64).alias("blank"),
        *(pl.col("labels").str.extract(rf'(?:^|,){label}="([^"]*)"').fill_null("").alias(col)
          for col, label in _LABELS.items()))
    m = m.filter(pl.col("value") < pl.col("blank")).with_columns(
        (pl.col("source") + "|" + pl.when(pl.col("uuid") != "").then(pl.col("uuid")).otherwise(pl.col("gpu")))
        .alias("gpu_key"))
    combine = pl.when(pl.col("name") == "DCGM_FI_DEV_FB_USED").then(pl.col("value").sum()).otherwise(
        pl.col("value").max())
    return (m.group_by("gpu_key", "t_ns", "name", maintain_order=True)
            .agg(combine.first().alias("value"), *(pl.col(c).first() for c in ("source", *_LABELS))))


def counter_increase(t_ns: np.ndarray, value: np.ndarray, start_ns: float, end_ns: float) -> float | None:
    """A counter's increase over [start_ns, end_ns]: its reset-corrected running increase interpolated
    linearly at both ends; None unless samples bracket the window (t_ns sorted ascending)."""
    if t_ns.size < 2 or t_ns[0] > start_ns or t_ns[-1] < end_ns:
        return None
    steps = np.diff(value)
    steps = np.where(steps < 0, value[1:], steps)   # a reset: the counter restarted from 0
    running = np.concatenate([[0.0], np.cumsum(steps)])
    return float(np.interp(end_ns, t_ns, running) - np.interp(start_ns, t_ns, running))


def _stats(v: pl.Series) -> dict:
    return {"mean": float(v.mean()) if v.len() else None, "max": float(v.max()) if v.len() else None,  # type: ignore[arg-type]
            "n": v.len()}


def section(tel: pl.DataFrame | None, start_ns: float | None, end_ns: float | None,
            output_tokens: int) -> dict | None:
    """summary.json `telemetry` (None without telemetry.parquet): per GPU and overall, over [start_ns,
    end_ns] (ns from t0; None: no measured window, every figure null)."""
    if tel is None:
        return None
    g = gpu_samples(tel)
    window = g.filter(pl.col("t_ns").is_between(start_ns, end_ns)) if start_ns is not None else g.clear()
    gpus = []
    for key in g["gpu_key"].unique(maintain_order=True).to_list():
        mine, inside = g.filter(pl.col("gpu_key") == key), window.filter(pl.col("gpu_key") == key)
        first = mine.row(0, named=True)
        entry: dict = {"source": first["source"], "gpu": first["gpu"], "uuid": first["uuid"],
                       "model": first["model"], "hostname": first["hostname"]}
        for gauge in GAUGES:
            entry[gauge.key] = _stats(inside.filter(pl.col("name") == gauge.name)["value"])
        e = mine.filter(pl.col("name") == ENERGY).sort("t_ns")
        mj = (counter_increase(e["t_ns"].to_numpy(), e["value"].to_numpy(), start_ns, end_ns)
              if start_ns is not None and end_ns is not None and e.height else None)
        entry["energy_j"] = mj / 1000 if mj is not None else None
        gpus.append(entry)
    return {"window_s": [start_ns / 1e9, end_ns / 1e9] if start_ns is not None and end_ns is not None else None,
            "gpus": gpus, "overall": _overall(window, gpus, output_tokens), "nodes": nodes(tel, start_ns, end_ns)}


def nodes(tel: pl.DataFrame, start_ns: float | None, end_ns: float | None) -> list[dict]:
    """Per node-exporter endpoint: `source`, `cpus`, `cpu_busy` (0..1 over the window; None unless every
    series' samples bracket it)."""
    cpu = tel.filter(pl.col("name") == NODE_CPU).with_columns(
        pl.col("labels").str.extract(r'(?:^|,)mode="([^"]*)"').alias("mode"))
    out = []
    for source in cpu["source"].unique(maintain_order=True).to_list():
        mine = cpu.filter(pl.col("source") == source)
        busy = None
        if start_ns is not None and end_ns is not None:
            idle = total = 0.0
            for (_, mode), series in mine.sort("t_ns").group_by("labels", "mode", maintain_order=True):
                inc = counter_increase(series["t_ns"].to_numpy(), series["value"].to_numpy(), start_ns, end_ns)
                if inc is None:
                    total = 0.0
                    break
                total += inc
                idle += inc if mode in IDLE_MODES else 0.0
            busy = 1 - idle / total if total > 0 else None
        n_cpus = mine["labels"].str.extract(r'(?:^|,)cpu="([^"]*)"').n_unique()
        out.append({"source": source, "cpus": n_cpus, "cpu_busy": busy})
    return out


def _overall(window: pl.DataFrame, gpus: list[dict], output_tokens: int) -> dict:
    out: dict = {"gpus": len(gpus)}
    for gauge in GAUGES:
        v = window.filter(pl.col("name") == gauge.name)
        if not gauge.total:
            out[gauge.key] = _stats(v["value"])
            continue
        means = [e[gauge.key]["mean"] for e in gpus if e[gauge.key]["mean"] is not None]
        peaks = (v.group_by("source", "t_ns").agg(pl.col("value").sum()).group_by("source")
                 .agg(pl.col("value").max())["value"])
        out[gauge.key] = {"mean": float(sum(means)) if means else None,
                          "max": float(peaks.sum()) if peaks.len() else None, "n": v.height}
    energies = [e["energy_j"] for e in gpus]
    energy_j = float(sum(energies)) if energies and None not in energies else None
    out["energy_j"] = energy_j
    out["output_tokens"] = output_tokens
    out["output_tokens_per_j"] = output_tokens / energy_j if energy_j else None
    return out
