"""`radixkv calibrate` times its grid in passes: the order of each pass, which points warm up,
each point's median, and the warm-up runs of one timed point."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from radixkv.offline.calibration import measure  # noqa: E402
from radixkv.offline.calibration.measure import COLD_RUN_S, WARM_RUNS, WARM_S, Grid, time_passes  # noqa: E402
from radixkv.engine.executor import StepResult  # noqa: E402

SMALL = dict(new=(8, 128), prefix=(0, 512), prefill_batch=(1,), decode_batch=(1, 4),
             context=(64, 512), max_step_tokens=4096)


def test_passes_run_every_point_once_each_the_first_in_grid_order():
    points = [((), (c,)) for c in range(1, 9)]
    seconds = {pt: (0.2 if pt[1][0] % 2 else 0.001) for pt in points}    # odd contexts: slow
    calls, progress = [], []

    def time_one(pt, warm):
        calls.append((pt, warm))
        return seconds[pt]

    times = time_passes(time_one, points, 3, np.random.default_rng(1),
                        lambda i, n: progress.append((i, n)))
    assert [pt for pt, _ in calls[:8]] == points                     # pass 1: grid order
    later = [[pt for pt, _ in calls[8 * k:8 * (k + 1)]] for k in (1, 2)]
    assert all(sorted(p) == points for p in later) and later != [points, points]
    assert times == [[seconds[pt]] * 3 for pt in points]
    # warm-up runs in every pass for cheap points, only in the first for slow ones
    for pt, warm in calls[8:]:
        assert warm == (seconds[pt] < COLD_RUN_S)
    assert all(warm for _, warm in calls[:8])
    assert progress == [(i, 24) for i in range(1, 25)]


class _Timed:
    """An executor whose steps take the given seconds, counting its runs."""

    def __init__(self, seconds):
        self.seconds, self.runs = seconds, 0
        self.kv = type("KV", (), {"num_slots": 100_000})()
        self.args = type("Args", (), {"vocab_size": 259})()

    def run(self, plan):
        self.runs += 1
        return StepResult([None] * len(plan.segments), self.seconds)


@pytest.mark.parametrize("seconds, warm, untimed, timed", [
    (0.002, True, WARM_RUNS, 5),         # cheap: warm until WARM_S, at most WARM_RUNS
    (0.006, True, 4, 5),                 # 4 runs pass WARM_S
    (0.3, True, 1, 4),                   # a long step: one run warms it; 4 reach the budget
    (0.3, False, 0, 4),
])
def test_time_point_warms_a_step_up_before_timing_it(seconds, warm, untimed, timed):
    assert WARM_S == 0.02
    ex = _Timed(seconds)
    t = measure.time_point(ex, ((), (64, 64)), 5, np.random.default_rng(0), 1.0, warm)
    assert t == pytest.approx(seconds) and ex.runs == untimed + timed


def test_calibrate_keeps_each_points_median_over_its_passes(monkeypatch):
    """Scripted pass times: every sample's seconds is the median of its three, all kept."""
    import torch

    from radixkv.offline.calibration.measure import calibrate, pool_slots
    from radixkv.model.executor import TorchExecutor
    grid = Grid(**SMALL, passes=3)
    points = grid.points()
    script = iter(np.random.default_rng(3).uniform(0.001, 0.01, 1 + 3 * len(points)))
    seen = []

    def fake(ex, pt, repeats, rng, budget_s=float("inf"), warm=True):
        seen.append((pt, repeats, budget_s))
        return float(next(script))

    monkeypatch.setattr(measure, "time_point", fake)
    ex = TorchExecutor.from_config("tiny-llama", pool_slots(points), device=torch.device("cpu"))
    prof = calibrate(ex, grid)
    assert len(seen) == 1 + 3 * len(points)
    assert all(r == grid.repeats and b == pytest.approx(grid.repeat_budget_s / 3)
               for _, r, b in seen[1:])
    by_point = {}
    for pt, _, _ in seen[1:]:
        by_point.setdefault(pt, 0)
        by_point[pt] += 1
    assert set(by_point.values()) == {3}
    assert [(s.segments, s.contexts) for s in prof.samples] == points
    for s in prof.samples:
        assert len(s.passes) == 3 and s.seconds == float(np.median(s.passes))
    assert prof.grid["passes"] == 3
    # decode batches looked up at the context that prices the held-out mixed ones better
    from radixkv.sim.profile import held_out
    held = {at: held_out(prof.model_spec, prof.samples, prof.coefficients, prof.spill_bytes,
                         decode_at=at).rms for at in ("mean", "max")}
    assert prof.decode_at == min(held, key=held.get)
    assert prof.held_out.rms == held[prof.decode_at]


def test_grid_passes_must_be_a_positive_int():
    with pytest.raises(ValueError, match="calibration grid: passes must be"):
        Grid(passes=0)
    import torch
    assert Grid.for_device(torch.device("cuda")).passes == 1 and Grid().passes == 3
