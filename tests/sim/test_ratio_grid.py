"""The grid's measured ratio to a profile's linear form: exact at the grid's points,
interpolated between them, held at the edges, filled where a point has no sample, and not
applied to prefill segments that differ; the held-out mixed batches; the file round trip, the linear format still read, and a decode run
priced to the bit as a planned step."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from radixkv.shapes import get_model_config
from radixkv.sim.profile import FEATURES, Profile, Sample, fit, held_out, load_profile, step_features
from radixkv.sim.ratio_grid import RatioGrid, decode_coords, prefill_coords
from radixkv.sim.specs import ModelSpec

SPEC = ModelSpec(get_model_config("tiny-llama"), dtype_bytes=4)
TRUE = dict(zip(FEATURES, (5e-4, 2e-5, 1e-11, 4e-13, 1e-11, 0.0, 2e-10, 0.0)))
NEW, PREFIX, PBATCH = (8, 64, 512, 2048), (0, 700, 3000), (1, 3)
DBATCH, CTX = (1, 2, 8, 32), (50, 900, 3000)
GRID = [(((p, n),) * b, ()) for n in NEW for p in PREFIX for b in PBATCH if n * b <= 4096] + \
       [((), (c,) * b) for b in DBATCH for c in CTX]
MIXED = [(((700, 512), (0, 20), (3000, 9)), ()), ((), (50, 900, 3000, 900)),
         (((0, 64), (700, 64)), ()), ((), (900, 50) * 2)]


def linear(segs, ctxs):
    return sum(TRUE[f] * x for f, x in zip(FEATURES, step_features(SPEC, segs, ctxs)))


def bump(segs, ctxs):
    """What the linear form misses, smooth in the step's shape: small decode batches dearer
    the longer their context, one-segment prefills cheaper the fewer tokens they bring."""
    if segs:
        n, p, lb = prefill_coords(max(segs, key=lambda x: x[1]), len(segs))
        return math.exp(-0.2 * math.exp(-lb) * (1 - n / 8) + 0.01 * p)
    lb, lc = decode_coords(len(ctxs), sum(ctxs) / len(ctxs))
    return math.exp(0.3 * math.exp(-lb) * lc / 8)


def profile(points=GRID + MIXED, corrected=True):
    samples = [Sample(s, c, linear(s, c) * bump(s, c)) for s, c in points]
    coef, res = fit(SPEC, samples)
    held = held_out(SPEC, samples, coef, None) if corrected else None
    return Profile(model=SPEC.model, dtype="float32", dtype_bytes=4, device="cpu",
                   device_name="test", backend="sdpa", machine={}, grid={}, coefficients=coef,
                   residuals=res, samples=tuple(samples), corrected=corrected, held_out=held)


def err(cost, segs, ctxs):
    return cost.step_time(segs, ctxs) / (linear(segs, ctxs) * bump(segs, ctxs)) - 1


def test_coordinates_by_hand():
    assert decode_coords(4, 100) == (math.log(4), math.log(101))
    assert prefill_coords((300, 30), 2) == (math.log(31), math.log(301), math.log(2))


def test_exact_at_every_grid_point_and_better_than_the_linear_form_between():
    cost, lin = profile().cost_model(), profile(corrected=False).cost_model()
    assert max(abs(err(lin, s, c)) for s, c in GRID) > 0.1
    assert max(abs(err(cost, s, c)) for s, c in GRID) < 1e-9
    between = [((), (1600,)), ((), (400,) * 4), ((), (2000,) * 16), (((1500, 1000),), ()),
               (((300, 30),) * 2, ()), (((2000, 300),), ())]
    # prefill segments that differ: the linear form alone
    for segs in ([(700, 512), (0, 20)], [(0, 64), (700, 64), (0, 64)]):
        assert cost.step_time(segs, ()) == lin.step_time(segs, ())
    assert np.mean([abs(err(cost, s, c)) for s, c in between]) < \
        0.5 * np.mean([abs(err(lin, s, c)) for s, c in between])


def test_multilinear_interpolation_by_hand():
    # a decode table on batch 1, 4 and contexts 0, 3: log ratios 0, 0.4 / 0.2, 0.6
    g = RatioGrid([((), (0,)), ((), (3,)), ((), (0,) * 4), ((), (3,) * 4)], [0.0, 0.4, 0.2, 0.6])
    assert math.log(g.decode_factor(1, 0, 0)) == pytest.approx(0.0)
    assert math.log(g.decode_factor(4, 12, 3)) == pytest.approx(0.6)
    # halfway in both log coordinates (batch 2, context 1): the mean of the four corners
    assert decode_coords(2, 1) == (math.log(4) / 2, math.log(4) / 2)
    assert math.log(g.decode_factor(2, 2, 1)) == pytest.approx(0.3)
    # a quarter of the way along the context axis at batch 1
    assert g.decode((0.0, math.log(4) / 4)) == pytest.approx(0.1)
    # beyond the grid: the edge value
    assert math.log(g.decode_factor(64, 64 * 10_000, 10_000)) == pytest.approx(0.6)
    assert g.prefill is None and g.factor([(0, 5)], []) == 1.0


def test_decode_batches_are_looked_up_at_their_longest_context_when_the_profile_says_so():
    steps = [((), (0,)), ((), (3,)), ((), (0,) * 4), ((), (3,) * 4)]
    mean, top = RatioGrid(steps, [0.0, 0.4, 0.2, 0.6]), RatioGrid(steps, [0.0, 0.4, 0.2, 0.6], "max")
    # four decodes at contexts 0, 0, 0, 3: at the longest, the table's corner (4, 3); at the
    # mean 0.75, log(1.75) / log(4) of the way along the context axis at batch 4
    assert math.log(top.factor([], [0, 0, 0, 3])) == pytest.approx(0.6)
    assert math.log(mean.factor([], [0, 0, 0, 3])) == pytest.approx(
        0.2 + 0.4 * math.log(1.75) / math.log(4))
    assert top.factor([], [3] * 4) == mean.factor([], [3] * 4)       # uniform: the same
    with pytest.raises(ValueError, match="decode_at must be one of mean, max, got 'median'"):
        RatioGrid(steps, [0.0] * 4, "median")


def test_a_grid_point_without_a_sample_takes_its_nearest_measured_neighbour():
    # batch 1, 4, 16 x contexts 0, 3, 15; (16, 15) is over the caps. Its nearest measured
    # points are (4, 15) and (16, 3), one grid step away: the first in grid order, the smaller
    # batch at the same context, is taken.
    pts = [((), (c,) * b) for b in (1, 4, 16) for c in (0, 3, 15) if (b, c) != (16, 15)]
    g = RatioGrid(pts, [0.1 * i for i in range(len(pts))])
    assert g.decode((math.log(16), math.log(16))) == pytest.approx(0.5)     # (4, 15)
    assert g.decode((math.log(16), math.log(4))) == pytest.approx(0.7)      # measured (16, 3)


def test_mixed_batches_are_held_out():
    prof = profile()
    cost, lin = prof.cost_model(), profile(corrected=False).cost_model()
    for priced, res in ((cost, prof.held_out),
                        (lin, held_out(SPEC, prof.samples, prof.coefficients, None, False))):
        rel = [abs(priced.step_time(s.segments, s.contexts) / s.seconds - 1)
               for s in prof.samples if (s.segments, s.contexts) in MIXED]
        assert res.samples == len(rel) == len(MIXED)
        assert res.rms == pytest.approx(float(np.sqrt(np.mean(np.square(rel)))))
        assert res.max_abs == pytest.approx(max(rel))
    assert held_out(SPEC, profile(GRID).samples, prof.coefficients, None) is None


def test_far_from_the_grid_the_edge_ratio_holds_and_empty_steps_cost_nothing():
    cost, lin = profile().cost_model(), profile(corrected=False).cost_model()
    assert cost.step_time((), ()) == 0.0
    edge, far = ((), (3000,) * 32), ((), (9000,) * 500)
    assert cost.step_time(*far) / lin.step_time(*far) == pytest.approx(
        cost.step_time(*edge) / lin.step_time(*edge))


@pytest.mark.parametrize("decode_at", ["mean", "max"])
def test_decode_run_pricing_is_the_planned_steps_to_the_bit(decode_at):
    cost = Profile(**{**profile().__dict__, "decode_at": decode_at}).cost_model()
    for ctxs in ((4000,) * 12, (6000, 10, 700), (50,), (899, 901)):
        assert cost.decode_step_time(len(ctxs), sum(ctxs), max(ctxs)) == cost.step_time((), ctxs)


def test_round_trip_and_the_linear_format_still_reads(tmp_path):
    prof = profile()
    prof.save(tmp_path / "p.json")
    back = load_profile(tmp_path / "p.json")
    assert back == prof and back.corrected and back.held_out == prof.held_out
    assert back.cost_model().step_time((), (900,)) == prof.cost_model().step_time((), (900,))
    top = Profile(**{**prof.__dict__, "decode_at": "max"})
    top.save(tmp_path / "top.json")
    back = load_profile(tmp_path / "top.json")
    assert back.decode_at == "max" and back.cost_model().step_time((), (50, 3000)) == \
        top.cost_model().step_time((), (50, 3000)) != prof.cost_model().step_time((), (50, 3000))
    doc = json.loads((tmp_path / "top.json").read_text())
    del doc["correction"]["decode_at"]              # written before decode_at: the mean
    (tmp_path / "mean.json").write_text(json.dumps(doc))
    assert load_profile(tmp_path / "mean.json").decode_at == "mean"
    doc["correction"]["decode_at"] = "median"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="decode_at must be one of mean, max, got 'median'"):
        load_profile(tmp_path / "bad.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    doc["format"] = "radixkv-profile/2"
    del doc["correction"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = load_profile(tmp_path / "old.json")
    assert not old.corrected and old.cost_model().step_time((), (50,)) == \
        profile(corrected=False).cost_model().step_time((), (50,))


@pytest.mark.parametrize("correction", [{"kind": "smooth"}, [1], "grid-ratio"])
def test_a_bad_correction_names_the_value(tmp_path, correction):
    doc = profile().to_json()
    doc["correction"] = correction
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="correction must be null or of kind 'grid-ratio', got "
                                         + repr(correction).replace("[", r"\[")):
        load_profile(tmp_path / "b.json")


def test_a_corrected_profile_without_grid_samples_is_refused():
    prof = profile()
    with pytest.raises(ValueError, match="needs its grid samples"):
        Profile(**{**prof.__dict__, "samples": tuple(s for s in prof.samples
                                                     if not RatioGrid.on_grid((s.segments, s.contexts)))})


def test_a_speed_factor_scales_every_step_and_a_bad_one_names_the_value():
    prof = profile()
    one, two = prof.cost_model(), prof.cost_model(2.0)
    for segs, ctxs in GRID + MIXED + [(((0, 5),), (900, 50))]:
        assert two.step_time(segs, ctxs) == pytest.approx(2 * one.step_time(segs, ctxs), rel=1e-12)
    assert two.decode_step_time(2, 950, 900) == two.step_time((), (900, 50))
    assert "x2" in two.label and "x" not in one.label.split("(")[-1]
    for bad in (0, -1.0, float("inf"), "2"):
        with pytest.raises(ValueError, match=f"speed factor must be a finite number > 0, got "
                                             f"{bad!r}"):
            prof.cost_model(bad)
