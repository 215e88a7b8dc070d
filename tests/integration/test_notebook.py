"""docs/examples/quickstart.ipynb executed as a user runs it (nbclient, a kernel of this very interpreter) in a
temporary working folder: two runs against the built-in simulator, a TTFT CDF figure, the decomposition.
What the cells printed is held to the runs' folders, and their TTFT order to the simulator's truth."""
import json
import re
import sys
from pathlib import Path

import nbformat
import polars as pl
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

import loadgen

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "examples" / "quickstart.ipynb"


def _kernel(tmp_path: Path) -> KernelManager:
    # A kernelspec of this interpreter in a folder of its own, so the notebook runs in the project's venv and
    # not in whatever `python3` kernel the machine has installed.
    spec = tmp_path / "kernels" / "loadgen-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "loadgen test", "language": "python"}))
    return KernelManager(kernel_name="loadgen-test",
                         kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


def test_the_example_notebook_runs_and_shows_what_the_runs_measured(tmp_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code), "commit it without outputs"
    work = tmp_path / "work"
    work.mkdir()
    NotebookClient(nb, km=_kernel(tmp_path), timeout=600, resources={"metadata": {"path": str(work)}}).execute()

    outputs = [o for c in code for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.text for o in outputs if o.output_type == "stream" and o.name == "stdout")
    figures = [o for o in outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert len(figures) == 1, [o.output_type for o in outputs]
    table = [o for o in outputs if o.output_type == "execute_result"][-1].data["text/plain"]
    for column in ("queue_ms", "prefill_ms", "decode_ms", "e2e_ms"):
        assert column in table, table

    # the two results folders, under the notebook's working folder (nothing lands in the checkout)
    folders = sorted((work / "results").iterdir())
    assert len(folders) == 2, folders
    runs = {int(r.requests["planned_prompt_tokens"].max()): r for r in map(loadgen.read, folders)}
    assert set(runs) == {128, 2048}
    p50 = {}
    for n, r in runs.items():
        # what the first cell printed is the run's own summary
        shown = re.search(rf"^{n}-token prompts: (\w+), (\d+) requests, TTFT p50 ([\d.]+) ms", text, re.M)
        assert shown, text
        assert shown.group(1) == r.status and int(shown.group(2)) == r.requests.height
        p50[n] = r.summary["latency_ms"]["ttft"]["p50"]
        assert abs(float(shown.group(3)) - p50[n]) < 0.06, (shown.group(0), p50[n])
        # the truth of the requests the figure draws (it also holds the calibration's idle probes)
        truth = r.sim_truth
        assert truth is not None and r.latencies.height > 0
        true_ttft = truth.filter(pl.col("request_id").is_in(r.latencies["request_id"].implode())).select(
            ((pl.col("first_token_ns") - pl.col("arrival_ns")) / 1e6).median()).item()
        p50[f"truth {n}"] = true_ttft
    # a 2048-token prefill takes longer than a 128-token one: the simulator's truth and the client agree
    assert p50["truth 2048"] > p50["truth 128"] and p50[2048] > p50[128], p50

    # the decomposition printed is the long run's summary (the means of its rows)
    means = runs[2048].summary["decomposition_ms"]["mean"]
    for part in ("queue", "prefill", "decode"):
        shown = re.search(rf"^  {part}\s+(-?[\d.]+)$", text, re.M)
        assert shown and abs(float(shown.group(1)) - means[part]) < 0.006, (part, text)
