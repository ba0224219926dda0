"""Profile features, the non-negative fit, the file round trip and bad profile files."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixkv.shapes import get_model_config
from radixkv.sim.costmodel import CostModel
from radixkv.sim.profile import FEATURES, Sample, fit, load_profile, nnls, step_features
from radixkv.sim.specs import ModelSpec

SPEC = ModelSpec(get_model_config("tiny-llama"), dtype_bytes=4)
TRUE = dict(zip(FEATURES, (5e-4, 2e-5, 1e-11, 4e-13, 1e-11, 0.0, 2e-10)))


def synthetic(points):
    return [Sample(s, c, sum(TRUE[f] * x for f, x in zip(FEATURES, step_features(SPEC, s, c))))
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
                                                  A * 2 * 2 * 6.0, K * 8.0, K * 2 * 6.0)
    assert step_features(SPEC, [], []) == (0.0,) * len(FEATURES)


def test_nnls_matches_a_known_solution():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nnls(a, np.array([1.0, -1.0, 0.0])) == pytest.approx([0.5, 0.0])


def test_fit_recovers_noise_free_times():
    coef, res = fit(SPEC, synthetic(POINTS))
    assert res.max_abs < 1e-6 and res.outliers == 0
    for s in synthetic(POINTS):
        pred = sum(coef[f] * x for f, x in zip(FEATURES, step_features(SPEC, s.segments, s.contexts)))
        assert pred == pytest.approx(s.seconds, rel=1e-6)


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
    del doc["residuals"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="malformed profile.*residuals"):
        load_profile(bad)
