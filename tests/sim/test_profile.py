"""Profile features, the non-negative fit, the spill threshold, the file round trip and bad
profile files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv.shapes import get_model_config
from radixkv.sim.costmodel import CostModel
from radixkv.sim.profile import (FEATURES, Profile, Sample, fit, fit_spill, load_profile, nnls,
                                 step_features)
from radixkv.sim.specs import ModelSpec

SPEC = ModelSpec(get_model_config("tiny-llama"), dtype_bytes=4)
TRUE = dict(zip(FEATURES, (5e-4, 2e-5, 1e-11, 4e-13, 1e-11, 0.0, 2e-10, 0.0)))
SPILL = dict(TRUE, spilled_kv_bytes=3e-10)
S = 8 << 20           # spill threshold of SPILL: 8 MiB of one layer's padded KV


def synthetic(points, true=TRUE, spill=None):
    return [Sample(s, c, sum(true[f] * x for f, x in zip(FEATURES, step_features(SPEC, s, c, spill))))
            for s, c in points]


POINTS = [(((p, n),) * b, ()) for n in (8, 64, 512) for p in (0, 700) for b in (1, 3)] + \
         [((), (c,) * b) for b in (1, 8, 32) for c in (50, 900)] + [(((0, 300), (40, 5)), ())]


def test_features_by_hand():
    # tiny-llama fp32: P = 1,545,728 - 259*256 = 1,479,424 non-embedding; A = 4*2*4*64 = 2048;
    # K = 2*2*2*64*4 = 2048 B. Segments (3, 2) and decode 5 -> (5, 1): B 2, T 3, pairs 2*3 + 3
    # + (5 + 1) = 15, Q 2, C 6.
    P, A, K = SPEC.flops_per_token // 2, 2048, 2048
    assert SPEC.attn_flops_per_ctx_token == A and SPEC.kv_bytes_per_token_per_gpu == K
    assert step_features(SPEC, [(3, 2)], [5]) == (1.0, 2.0, 2.0 * P * 3, A * 15.0,
                                                  A * 2 * 2 * 6.0, K * 8.0, K * 2 * 6.0, 0.0)
    assert step_features(SPEC, [], []) == (0.0,) * len(FEATURES)


def test_spilled_bytes_count_once_one_layers_grid_is_over_the_threshold():
    # one layer's padded grid: K * B * C / 2 layers = 1024 * B * C bytes
    K = 2048
    assert step_features(SPEC, (), (4095,) * 4, 1024 * 4 * 4096 - 1)[6:] == (K * 4 * 4096.0,) * 2
    assert step_features(SPEC, (), (4095,) * 4, 1024 * 4 * 4096)[7] == 0.0
    assert step_features(SPEC, (), (4095,) * 4, None)[7] == 0.0
    assert step_features(SPEC, [(100, 28)], (), 1.0)[7] == K * 128.0


def test_nnls_matches_a_known_solution():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nnls(a, np.array([1.0, -1.0, 0.0])) == pytest.approx([0.5, 0.0])


def test_fit_recovers_noise_free_times():
    coef, res = fit(SPEC, synthetic(POINTS))
    assert res.max_abs < 1e-6 and res.outliers == 0
    for s in synthetic(POINTS):
        pred = sum(coef[f] * x for f, x in zip(FEATURES, step_features(SPEC, s.segments, s.contexts)))
        assert pred == pytest.approx(s.seconds, rel=1e-6)


SPILL_POINTS = POINTS + [((), (c,) * b) for b in (4, 12, 32) for c in (2048, 4096, 6144)]


def test_fit_spill_finds_the_threshold_between_two_measured_sizes():
    samples = synthetic(SPILL_POINTS, SPILL, S)
    coef, res, spill = fit_spill(SPEC, samples)
    below = max(w for w in (s / 2 for s in (step_features(SPEC, x.segments, x.contexts)[6]
                                             for x in samples)) if w <= S)
    above = min(w for w in (s / 2 for s in (step_features(SPEC, x.segments, x.contexts)[6]
                                             for x in samples)) if w > S)
    assert spill == pytest.approx((below * above) ** 0.5) and below < spill < above
    assert res.max_abs < 1e-6 and coef["spilled_kv_bytes"] == pytest.approx(3e-10, rel=1e-6)
    # without a spill in the data the threshold is none (or spill costs nothing)
    coef, res, spill = fit_spill(SPEC, synthetic(SPILL_POINTS))
    assert res.max_abs < 1e-6 and (spill is None or coef["spilled_kv_bytes"] < 1e-20)


def test_spill_threshold_round_trips_and_prices_decodes(tmp_path):
    samples = synthetic(SPILL_POINTS, SPILL, S)
    coef, res, spill = fit_spill(SPEC, samples)
    prof = Profile(model=SPEC.model, dtype="float32", dtype_bytes=4, device="cpu",
                   device_name="test", backend="sdpa", machine={}, grid={}, coefficients=coef,
                   residuals=res, samples=tuple(samples), spill_bytes=spill)
    prof.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    assert back == prof and back.spill_bytes == spill
    cost = back.cost_model()
    for ctxs in ((4000,) * 12, (6000, 10, 700), (50,)):
        assert cost.decode_step_time(len(ctxs), sum(ctxs), max(ctxs)) == cost.step_time((), ctxs)
        assert cost.step_time((), ctxs) == pytest.approx(synthetic([((), ctxs)], SPILL, S)[0].seconds)


def test_round_trip_and_cost_model(tmp_path, profile_factory):
    prof = profile_factory(synthetic(POINTS))
    path = tmp_path / "p.json"
    prof.save(path)
    back = load_profile(path, model="tiny-llama")
    assert back == prof and back.samples == prof.samples
    cost = CostModel.from_profile(path)
    s = synthetic([(((100, 20),), (300, 7))])[0]
    assert cost.step_time(s.segments, s.contexts) == pytest.approx(s.seconds)
    assert cost.prefill_time([(0, 8)]) > 0 and cost.decode_time([]) == 0.0
    assert "tiny-llama" in cost.label


def test_bad_profiles_name_the_value(tmp_path, profile_factory):
    with pytest.raises(ValueError, match="nope.json.*does not exist"):
        load_profile(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not valid JSON"):
        load_profile(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="'other'"):
        load_profile(bad)
    bad.write_text(json.dumps({"format": "radixkv-profile/1"}))
    with pytest.raises(ValueError, match="older profile.*re-run `radixkv calibrate`"):
        load_profile(bad)
    good = tmp_path / "good.json"
    profile_factory(synthetic(POINTS)).save(good)
    with pytest.raises(ValueError, match="'tiny-llama', not 'llama-3-8b'"):
        load_profile(good, model="llama-3-8b")
    doc = json.loads(good.read_text())
    del doc["coefficients"]["step"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="coefficients must be exactly"):
        load_profile(bad)
    doc["coefficients"]["step"] = -1.0
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="coefficient step .* -1.0"):
        load_profile(bad)
    doc["coefficients"]["step"], doc["spill_bytes"] = 1.0, -5
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="spill_bytes .* -5"):
        load_profile(bad)
    del doc["residuals"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="malformed profile.*residuals"):
        load_profile(bad)


def test_a_samples_passes_round_trip_and_give_its_spread(tmp_path, profile_factory):
    """A sample timed in several passes keeps each pass's seconds; the file keeps them, and a
    one-pass sample (or an older file without them) reads back with none."""
    samples = synthetic(POINTS)
    timed = [Sample(s.segments, s.contexts, s.seconds,
                    (s.seconds * 0.9, s.seconds, s.seconds * 1.2)) for s in samples[:3]]
    prof = profile_factory(timed + samples[3:])
    path = tmp_path / "p.json"
    prof.save(path)
    back = load_profile(path)
    assert back.samples == prof.samples and back.samples[0].passes == timed[0].passes
    assert back.samples[0].spread == pytest.approx(0.3) and back.samples[3].spread == 0.0
    doc = json.loads(path.read_text())
    assert "passes" in doc["samples"][0] and "passes" not in doc["samples"][3]
    with pytest.raises(ValueError, match="seconds must be > 0, got -0.001"):
        Sample(((0, 8),), (), 0.01, (0.01, -0.001))
    doc["samples"][0]["passes"] = [0.01, 0.0]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="seconds must be > 0, got 0.0"):
        load_profile(path)
