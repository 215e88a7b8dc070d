"""[image] (issue 26, item 4): chat requests carrying generated PNG images, end to end against the built-in
simulator through `loadgen run` and `loadgen report`. The simulator decodes each image's size from the
bytes it received and charges ceil(w/28) * ceil(h/28) prompt tokens for it (sim/images.py); the test checks
the plan against that truth: which requests carried how many images of what size, and that the rows see
the server's charge in their usage while the text stays exact."""
import math
import textwrap

import polars as pl

from loadgen.results.folder import read_run
from tests.integration.conftest import RELAXED_SELFCHECK, loadgen, report_json

SIM = "--sim-args=--mode fixed --ttft 20ms --itl 5ms"


def workload(tmp_path, api: str = "chat", image: str = "", height: int = 448) -> str:
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent(f"""
        model = "sim"
        api = "{api}"
        seed = 9
        [arrivals]
        process = "poisson"
        rate = "20/s"
        [run]
        requests = 30
        [prompt]
        tokens = {{ dist = "uniform", min = 20, max = 60 }}
        [output]
        tokens = 4
        [image]
        share = 0.5
        count = {{ dist = "uniform", min = 1, max = 3 }}
        width = {{ dist = "cycle", values = [448, 100, 57] }}
        height = {height}
        """) + image)
    return str(w)


def test_images_are_sent_and_charged_as_the_server_counts_them(tmp_path):
    out = tmp_path / "run"
    p = loadgen("run", workload(tmp_path), "--out", str(out), "--quiet", "--no-calibrate", SIM, *RELAXED_SELFCHECK)
    assert p.returncode == 0, p.stderr
    run = read_run(out)
    truth = pl.read_parquet(out / "sim_truth.parquet").select("request_id", "image_tokens", "outcome")
    req = run.requests.join(truth, on="request_id")
    with_images = req.filter(pl.col("images").is_not_null())
    assert 5 < with_images.height < 25 and set(req["outcome"]) == {"ok"}
    assert set(with_images["images"]) <= {1, 2, 3} and set(with_images["image_width"]) <= {448, 100, 57}
    # the server read from the bytes the sizes the plan drew: its charge is the rule applied to the plan
    rule = [n * math.ceil(w / 28) * math.ceil(h / 28) for n, w, h in
            zip(with_images["images"], with_images["image_width"], with_images["image_height"])]
    assert with_images["image_tokens"].to_list() == rule
    assert (req.filter(pl.col("images").is_null())["image_tokens"] == 0).all()
    # the rows' usage holds the server's charge on top of the exact text
    assert ((with_images["prompt_tokens"] - with_images["planned_prompt_tokens"]) == with_images["image_tokens"]).all()
    plain = req.filter(pl.col("images").is_null())
    assert (plain["prompt_tokens"] == plain["planned_prompt_tokens"]).all()
    assert run.manifest["workload"]["prompt_lengths"]["exact"] is True
    s = report_json(str(out))["images"]
    measured = with_images.filter(~pl.col("warmup"))
    assert s["requests"] == measured.height and s["images"] == measured["images"].sum()
    assert s["image_tokens"]["total"] == measured["image_tokens"].sum()


def test_images_need_a_chat_endpoint(tmp_path):
    p = loadgen("run", workload(tmp_path, api="completions"), "--out", str(tmp_path / "r"), "--quiet", SIM)
    assert p.returncode == 2 and 'image: images are sent as chat message parts: needs api = "chat"' in p.stderr
    p = loadgen("run", workload(tmp_path, image='fill = "glossy"\n'), "--out", str(tmp_path / "r"), "--quiet", SIM)
    assert p.returncode == 2 and "image.fill: must be one of noise, flat" in p.stderr, p.stderr
    p = loadgen("run", workload(tmp_path, height=9000), "--out", str(tmp_path / "r"), "--quiet", SIM)
    assert p.returncode == 2 and "image.height: drawn up to 9,000, at most 8,192" in p.stderr, p.stderr
