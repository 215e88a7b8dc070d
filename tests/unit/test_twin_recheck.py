"""`loadgen fit --recheck` (loadgen/twin/recheck.py): the two speed factors recovered from probes of a server
whose prompt work and step work moved apart, the profile and its rounds scaled by them, the [recheck] table
read back into predict's intervals, and the flag's bad input. Against the simulator at another speed:
tests/integration/test_fit_sim.py."""
from __future__ import annotations

import dataclasses
import math

import pytest

from loadgen.cli.main import main
from loadgen.sim.profiles import load_profile
from loadgen.twin.fit_model import coefficients, predicted_step_s, predicted_ttft_s
from loadgen.twin.fit_probe import DecodeSample, PrefillSample, ProbeFailed
from loadgen.twin.intervals import Spread, band, load_spread
from loadgen.twin.recheck import PROMPT_TERMS, STEP_TERMS, factors, profile_text, scaled
from tests.unit.test_twin_intervals import LIMITS, TINY, write_fitted

CPU = dataclasses.replace(TINY, multi_token_us=900.0, multi_token_kv_us=0.4, memory_compute="sum")


def probes(p, noise=()):
    """What a server running as profile `p` gives the recheck's probes (no server prompt time: TTFT)."""
    noise = iter(noise)
    pre = [PrefillSample(n, predicted_ttft_s(p, n) * next(noise, 1.0), None) for n in (256, 1024) * 3]
    dec = [DecodeSample(b, c, 48, 0.0) for b, c in ((1, 16), (1, 1024), (2, 1024)) * 3]
    return pre, [dataclasses.replace(d, step_s=predicted_step_s(p, d) * next(noise, 1.0)) for d in dec]


@pytest.mark.parametrize("profile", [TINY, CPU], ids=["roofline", "cpu-sum"])
@pytest.mark.parametrize("prefill, decode", [(1.0, 1.0), (1.2, 0.9), (0.8, 1.15)])
def test_factors_recover_how_prompt_and_step_work_moved(profile, prefill, decode):
    now = scaled(profile, prefill, decode)
    f = factors(profile, *probes(now))
    assert (f.prefill, f.decode) == pytest.approx((prefill, decode), rel=1e-6)
    assert f.se_log == pytest.approx(0.0, abs=1e-6) and f.samples == 15
    # scaled by them, the profile predicts the probes it was rechecked on
    again = scaled(profile, f.prefill, f.decode)
    pre, dec = probes(now)
    for s in pre:
        assert predicted_ttft_s(again, s.prompt_tokens) == pytest.approx(s.ttft_s, rel=1e-6)
    for d in dec:
        assert predicted_step_s(again, d) == pytest.approx(d.step_s, rel=1e-6)


def test_scaled_moves_only_its_terms_and_noise_gives_a_standard_error():
    c, s = coefficients(CPU), coefficients(scaled(CPU, 2.0, 3.0))
    for k in PROMPT_TERMS:
        assert getattr(s, k) == pytest.approx(2 * getattr(c, k)), k
    for k in STEP_TERMS:
        assert getattr(s, k) == pytest.approx(3 * getattr(c, k)), k
    assert s.request_overhead == c.request_overhead   # the front end's, kept
    # probes that scatter 3 % around a server 10 % slower: the factors near 1.1, their standard error ~1 %
    wobble = [math.exp(0.03 * x) for x in (1, -1, 0.5, -0.5, 1.5, -1.5, 0, 1, -1, 0.3, -0.3, 0.8, -0.8, 0.2, -0.2)]
    f = factors(CPU, *probes(scaled(CPU, 1.1, 1.1), wobble))
    assert f.prefill == pytest.approx(1.1, rel=0.03) and f.decode == pytest.approx(1.1, rel=0.03)
    assert 0.003 < f.se_log < 0.03


def test_factors_refuse_probes_that_cannot_tell_the_work_apart():
    pre, dec = probes(TINY)
    with pytest.raises(ProbeFailed, match="cannot tell the prompt work from the step work"):
        factors(TINY, pre[:1], dec[:1])


def test_the_rechecked_file_reads_back_and_widens_the_intervals(tmp_path):
    path = write_fitted(tmp_path, (0.9, 1.0, 1.1))
    profile = load_profile(str(path))
    spread = load_spread(str(path), profile)
    now = scaled(profile, 1.2, 1.1)
    rounds = Spread([scaled(r, 1.2, 1.1) for r in spread.rounds], spread.misfit_rel, 0.02)
    out = tmp_path / "now.toml"
    out.write_text(profile_text(now, rounds, {"profile_from": str(path), "url": "http://x", "samples": 15,
                                              "probe_s": 4.0, "prefill_scale": 1.2, "decode_scale": 1.1,
                                              "se_log": 0.02}))
    back = load_profile(str(out))
    got = load_spread(str(out), back)
    assert got.recheck_se_log == 0.02 and got.misfit_rel == spread.misfit_rel and len(got.rounds) == 3
    assert back.decode_ns(1, 100) == pytest.approx(now.decode_ns(1, 100), rel=1e-9)
    assert [r.prefill_ns(1, 512) for r in got.rounds] == pytest.approx([r.prefill_ns(1, 512) for r in rounds.rounds])
    assert (back.max_num_seqs, back.max_model_len) == (LIMITS.max_num_seqs, LIMITS.max_model_len)
    # the recheck's standard error adds in quadrature, in logs
    lo, hi = band(100.0, [100.0] * 4, 0.8, 0.0, 0.02)
    assert math.log(hi / 100) == pytest.approx(math.log(100 / lo)) and hi > 100
    assert band(100.0, [90.0, 110.0, 100.0], 0.8, 0.05, 0.02)[1] > band(100.0, [90.0, 110.0, 100.0], 0.8, 0.05)[1]
    out.write_text(out.read_text().replace("se_log = 0.02", "se_log = -1"))
    with pytest.raises(ValueError, match=r"now.toml: \[recheck\] 'se_log' must be a number from 0 to 10"):
        load_spread(str(out), back)


def test_recheck_flag_bad_input(tmp_path, capsys):
    path = write_fitted(tmp_path, (0.9, 1.1))
    assert main(["fit", "--url", "http://127.0.0.1:9", "--recheck", str(path), "--out", str(tmp_path / "n.toml"),
                 "--max-num-seqs", "2"]) == 2
    assert "--max-num-seqs: not with --recheck" in capsys.readouterr().err
    assert main(["fit", "--url", "http://127.0.0.1:9", "--recheck", str(tmp_path / "none.toml"),
                 "--out", str(tmp_path / "n.toml")]) == 2
    assert f"--recheck {tmp_path / 'none.toml'}: no such file" in capsys.readouterr().err
