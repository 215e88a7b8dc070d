"""Calibration probes are made by the run's own tokenizer and stay inside the target's context; a
calibration that cannot run says why (stderr, manifest) and the report says the split is unavailable."""
import re
import textwrap

import orjson
import polars as pl
import pytest

from tests.integration.conftest import RELAXED_SELFCHECK, loadgen

SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zu", "pe", "di", "go", "ha", "ji", "fu", "be"]


@pytest.fixture(scope="module")
def syllable_tokenizer(tmp_path_factory):
    """A tokenizer.json where each 2-letter syllable is a token: a 5-syllable word is 5 tokens, not 1."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *SYLLABLES, "a", "I", "1", "2", "3", "x", "y", "z", ".", ","])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Split(Regex("[a-z]{2}|."), "isolated")])
    p = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(p))
    return p


def _workload(tmp_path, extra: str = "") -> str:
    w = tmp_path / "w.toml"
    w.write_text(textwrap.dedent("""
        api = "completions"
        seed = 7
        [arrivals]
        process = "poisson"
        rate = "20/s"
        [run]
        requests = 6
        drain_timeout = "10s"
        [output]
        tokens = 4
        """) + (extra or "[prompt]\n") + 'tokens = { dist = "uniform", min = 100, max = 400 }\n')
    return str(w)


def test_probes_are_counted_by_the_runs_tokenizer_and_stay_inside_the_context(tmp_path, syllable_tokenizer):
    out = tmp_path / "run"
    w = _workload(tmp_path, f'[prompt]\ntokenizer = "local"\ntokenizer_file = "{syllable_tokenizer}"\n')
    p = loadgen("run", w, "--out", str(out), *RELAXED_SELFCHECK,
                "--sim-args", "--mode fixed --ttft 5ms --itl 1ms --max-model-len 300", "--over-context", "clip")
    # the simulator counts words, the run's tokenizer syllables: the run's own lengths are not the
    # server's (exit 3); its probes must be the run tokenizer's lengths all the same
    assert p.returncode in (0, 3), p.stderr
    assert (out / "calibration.json").is_file()
    probed = [int(x) for x in re.search(r"prompt lengths \[([0-9, ]+)\]", p.stderr).group(1).split(",")]
    assert max(probed) <= 300 - 8  # inside the context with the probes' 8 output tokens
    truth = pl.read_parquet(out / "sim_truth.parquet").filter(pl.col("request_id").str.starts_with("calib-"))
    assert truth.height == 1 + 3 * len(probed) and truth["http_status"].to_list() == [200] * truth.height
    # A probe of L syllable tokens is L//5 five-syllable words plus L%5 one-token fillers (some glued to a
    # word, as "."): L//5 to L//5 + L%5 words to the simulator. The whitespace rule would have sent L words.
    for words in truth["prompt_tokens"].to_list():
        assert any(L // 5 <= words <= L // 5 + L % 5 for L in probed), (words, probed)
    assert max(truth["prompt_tokens"]) < min(probed)


def test_a_calibration_that_fails_says_why_and_the_report_says_the_split_is_unavailable(tmp_path):
    out = tmp_path / "run"
    p = loadgen("run", _workload(tmp_path), "--out", str(out), *RELAXED_SELFCHECK,
                "--sim-args", "--mode fixed --ttft 5ms --itl 1ms --faults http500=1")
    assert "WARNING: calibration failed: the first probe (" in p.stderr and "HTTP 500" in p.stderr, p.stderr
    manifest = orjson.loads((out / "manifest.json").read_bytes())
    assert manifest["calibration"].startswith("failed: the first probe (")
    assert "http_error HTTP 500" in manifest["calibration"]
    assert not (out / "calibration.json").exists()
    report = loadgen("report", str(out))
    assert report.returncode == 0, report.stderr
    # every request failed (http500=1): nothing to decompose, and still the reason the split is unavailable
    assert "decomposition: no ok request with a first token to split" in report.stdout
    assert "queue/prefill split UNAVAILABLE: the idle-server calibration failed: the first probe" in report.stdout
    md = loadgen("report", str(out), "--format", "md")
    assert md.returncode == 0, md.stderr
    assert "queue/prefill split UNAVAILABLE: the idle-server calibration failed: the first probe" in md.stdout
