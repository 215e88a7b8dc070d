"""Prometheus `/metrics` for the simulator, with vLLM V1's metric names, labels and buckets
(from vllm/v1/metrics/loggers.py), written by hand in the text exposition format.

Times observed here are real elapsed seconds (what a client measures), never profile time.
Also exported: `loadgen_sim_emit_lateness_seconds`, the simulator's own health (send time of a
token minus the time it was due), and `loadgen_sim_speed` (the --speed factor).
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence

TTFT_BUCKETS_S = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS_S = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS_S = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                             40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
LATENESS_BUCKETS_S = [1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                      1e-2, 2.5e-2, 5e-2, 0.1, 0.5, 1.0]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    # vLLM's buckets for token counts: 1, 2, 5, 10, 20, 50, ... up to max_value
    out: list[int] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_value:
                return out
            out.append(v)
        exp += 1


class Histogram:
    def __init__(self, name: str, doc: str, buckets: Sequence[float]):
        self.name, self.doc, self.buckets = name, doc, buckets
        self.counts = [0] * (len(buckets) + 1)  # last = +Inf only
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def render(self, labels: str, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {self.doc}")
        out.append(f"# TYPE {self.name} histogram")
        acc = 0
        for le, c in zip(self.buckets, self.counts):
            acc += c
            out.append(f'{self.name}_bucket{{{labels},le="{float(le)}"}} {acc}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{self.name}_count{{{labels}}} {self.count}")
        out.append(f"{self.name}_sum{{{labels}}} {self.sum}")


class SimMetrics:
    def __init__(self, model_name: str, speed: float, max_model_len: int = 8192):
        self.labels = f'engine="0",model_name="{model_name}"'
        self.speed = speed
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0  # fraction 0..1
        self.counters = {"vllm:num_preemptions": 0, "vllm:prompt_tokens": 0,
                         "vllm:generation_tokens": 0, "vllm:prefix_cache_queries": 0,
                         "vllm:prefix_cache_hits": 0}
        self.request_success = 0  # vllm:request_success_total{finished_reason="length"}
        H = Histogram
        self.ttft = H("vllm:time_to_first_token_seconds",
                      "Histogram of time to first token in seconds.", TTFT_BUCKETS_S)
        self.itl = H("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS_S)
        self.tpot = H("vllm:time_per_output_token_seconds",
                      "Histogram of time per output token in seconds.", ITL_BUCKETS_S)
        self.e2e = H("vllm:e2e_request_latency_seconds",
                     "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS_S)
        self.queue = H("vllm:request_queue_time_seconds",
                       "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.inference = H("vllm:request_inference_time_seconds",
                           "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.prefill = H("vllm:request_prefill_time_seconds",
                         "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.decode = H("vllm:request_decode_time_seconds",
                        "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS_S)
        self.iteration_tokens = H("vllm:iteration_tokens_total",
                                  "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS)
        self.prompt_tokens = H("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                               build_1_2_5_buckets(max_model_len))
        self.generation_tokens = H("vllm:request_generation_tokens", "Number of generation tokens processed.",
                                   build_1_2_5_buckets(max_model_len))
        self.lateness = H("loadgen_sim_emit_lateness_seconds",
                          "Simulator health: token send time minus its due time.", LATENESS_BUCKETS_S)

    def observe_request(self, row: dict) -> None:
        # row: a truth row (see truth.py) of a request that completed with at least one token, or a pooling
        # request (embeddings, rerank) that completed: no token, no TTFT/ITL/TPOT, its prefill and e2e
        tok = row["token_ns"]
        pooled = row["endpoint"] in ("embeddings", "rerank")
        if row["outcome"] != "ok" or not (tok or pooled):
            return
        self.request_success += 1
        self.prompt_tokens.observe(row["prompt_tokens"])
        self.generation_tokens.observe(len(tok))
        if not pooled:
            self.ttft.observe((row["first_token_ns"] - row["arrival_ns"]) / 1e9)
        for a, b in zip(tok, tok[1:]):
            self.itl.observe((b - a) / 1e9)
        if len(tok) > 1:
            self.tpot.observe((tok[-1] - tok[0]) / 1e9 / (len(tok) - 1))
        self.e2e.observe((row["finish_ns"] - row["arrival_ns"]) / 1e9)
        self.queue.observe(row["queue_ns"] / 1e9)
        self.inference.observe((row["finish_ns"] - row["scheduled_ns"]) / 1e9)
        self.prefill.observe(row["prefill_ns"] / 1e9)
        self.decode.observe(row["decode_ns"] / 1e9)

    def render(self) -> str:
        L = self.labels
        out: list[str] = []
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", self.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", self.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", self.kv_usage),
            ("loadgen_sim_speed", "Simulator time dilation: profile time = real time * speed.", self.speed),
        ):
            out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{L}}} {value}"]
        for name, value in self.counters.items():
            out += [f"# HELP {name} Cumulative count.", f"# TYPE {name} counter", f"{name}_total{{{L}}} {value}"]
        out += ["# HELP vllm:request_success Count of successfully processed requests.",
                "# TYPE vllm:request_success counter",
                f'vllm:request_success_total{{{L},finished_reason="length"}} {self.request_success}']
        for h in (self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.inference, self.prefill,
                  self.decode, self.iteration_tokens, self.prompt_tokens, self.generation_tokens, self.lateness):
            h.render(L, out)
        return "\n".join(out) + "\n"
