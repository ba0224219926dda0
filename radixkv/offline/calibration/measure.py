"""Timing the torch executor's steps for `radixkv calibrate`: synthetic BatchPlans over a grid,
each run through TorchExecutor.run (the call the engine times), then the fit of
radixkv.sim.profile.

Grid: prefill steps of `batch` equal segments of `new` tokens after `prefix` cached ones, plus
mixed prefill batches (one long segment, of at most a quarter of `max_step_tokens`, beside short
ones, so padding is seen: their padded grid is what makes them slow to time); decode steps of
`batch` requests at `context` tokens (at most `max_decode_context` context tokens in all), plus
decode batches with mixed contexts. Each point is run back to back, as an engine's steps are
(a decode step follows one of nearly the same shape), up to `repeats` times after warm-up
runs, fewer once the timed runs add up to `repeat_budget_s` / `passes` (a 3 s prefill varies by
well under the 1 % that repeating it would win); the mean is kept, the expected step of a real
run on a machine that others share (time_point). The grid is timed `passes` times over, each
pass after the first in a fresh random order, and a point's time is the median of its passes:
a shared machine runs some seconds 30 % faster or slower than others, and in one pass such a
spell falls on a run of neighbouring points (every two-request decode of one profile timed
~30 % fast against the same steps a minute later, and a real run's two-request decodes priced
that much low).

The CPU grid reaches what CPU-sized workloads do: prefills up to the default chunk (8192 new
tokens a step) after prefixes up to 4096, decode batches up to 64 and contexts up to 6144,
beyond the cache-spill threshold of a padded decode grid (radixkv.sim.profile). Each sequence's context is one
contiguous run of slots at a random place in the pool, as a pool that has not fragmented hands
them out (on a CPU, a gather of scattered slots costs several times a contiguous one).
"""
from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixkv.engine.executor import BatchPlan
from radixkv.model.executor import TorchExecutor
from radixkv.sched.batch import Segment
from radixkv.sched.request import Request
from radixkv.sim.profile import Profile, Sample, fit_spill, held_out
from radixkv.sim.ratio_grid import DECODE_AT
from radixkv.sim.specs import ModelSpec
from radixkv.argcheck import positive_int

Point = tuple[tuple[tuple[int, int], ...], tuple[int, ...]]     # (prefill segments, decode contexts)
COLD_RUN_S = 0.05     # a step this long is timed without a warm-up run in later passes
WARM_S, WARM_RUNS = 0.02, 10    # untimed runs of a point until they add up to WARM_S, at most


@dataclass(frozen=True)
class Grid:
    """The calibration grid. CPU: tiny-llama in ~60-90 s on one thread."""
    new: tuple[int, ...] = (8, 32, 128, 384, 1024, 2048, 4096)
    prefix: tuple[int, ...] = (0, 512, 1536, 4096)
    prefill_batch: tuple[int, ...] = (1, 3)
    decode_batch: tuple[int, ...] = (1, 2, 4, 12, 32, 64)
    context: tuple[int, ...] = (64, 256, 768, 1280, 2048, 4096, 6144)
    max_step_tokens: int = 8192          # new tokens of one prefill step at most
    max_decode_context: int = 200_000    # context tokens of one decode step at most
    repeats: int = 5                     # timed runs of a point in each pass, at most
    repeat_budget_s: float = 0.5         # a point's timed runs in all passes add up to this
    passes: int = 3                      # times the grid is timed over (module doc)
    seed: int = 0
    max_slots: int = 0                   # > 0: points needing a larger KV pool are left out

    def __post_init__(self):
        for name in ("new", "prefix", "prefill_batch", "decode_batch", "context"):
            vals = getattr(self, name)
            if not vals:
                raise ValueError(f"calibration grid: {name} is empty")
            for v in vals:
                positive_int(v, f"calibration grid: {name}") if name != "prefix" else None
        positive_int(self.max_step_tokens, "calibration grid: max_step_tokens")
        positive_int(self.max_decode_context, "calibration grid: max_decode_context")
        if not (isinstance(self.repeat_budget_s, (int, float)) and self.repeat_budget_s > 0):
            raise ValueError(f"calibration grid: repeat_budget_s must be > 0, got "
                             f"{self.repeat_budget_s!r}")
        positive_int(self.repeats, "calibration grid: repeats")
        positive_int(self.passes, "calibration grid: passes")
        if not (isinstance(self.max_slots, int) and self.max_slots >= 0):
            raise ValueError(f"calibration grid: max_slots must be an int >= 0, got "
                             f"{self.max_slots!r}")

    @classmethod
    def for_device(cls, device: torch.device) -> "Grid":
        if device.type == "cuda":
            return cls(new=(16, 128, 512, 2048, 8192), prefix=(0, 1024, 4096),
                       prefill_batch=(1, 4), decode_batch=(1, 8, 32, 128, 256),
                       context=(256, 1024, 4096), max_step_tokens=16384,
                       max_decode_context=1 << 20, repeats=5, passes=1)
        return cls()

    def points(self) -> list[Point]:
        rng = np.random.default_rng(self.seed)
        out: list[Point] = []
        for n in self.new:
            for p in self.prefix:
                for b in self.prefill_batch:
                    if n * b <= self.max_step_tokens:
                        out.append((((p, n),) * b, ()))
        longs = [n for n in self.new if n <= self.max_step_tokens // 4] or [min(self.new)]
        for _ in range(len(out) // 3):            # mixed prefill batches: one long, some short
            long_n = int(rng.choice(longs))
            short = [(int(rng.choice(self.prefix)), int(rng.integers(1, 64)))
                     for _ in range(int(rng.integers(1, 6)))]
            out.append((((int(rng.choice(self.prefix)), long_n), *short), ()))
        for b in self.decode_batch:
            fits = [c for c in self.context if b * c <= self.max_decode_context]
            for c in fits:
                out.append(((), (c,) * b))
            if fits:
                ctxs = rng.integers(min(self.context), max(fits) + 1, b)
                out.append(((), tuple(int(c) for c in ctxs)))
        if self.max_slots:
            out = [pt for pt in out if pool_slots([pt]) <= self.max_slots]
        if not out:
            raise ValueError(f"calibration grid: no point fits a KV pool of {self.max_slots:,} slots")
        return out

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


def pool_slots(points: Sequence[Point]) -> int:
    """Slots the largest step needs: every sequence's whole context, disjoint."""
    return max(sum(p + n for p, n in segs) + sum(c + 1 for c in ctxs) for segs, ctxs in points)


def plan_of(point: Point, num_slots: int, vocab: int, rng: np.random.Generator) -> BatchPlan:
    segs, ctxs = point
    todo = [("e", s) for s in segs] + [("d", (c, 1)) for c in ctxs]
    total = sum(p + n for _, (p, n) in todo)
    plan, at = BatchPlan(), int(rng.integers(0, num_slots - total + 1))
    for i, (kind, (p, n)) in enumerate(todo):
        seg = Segment(Request(f"cal{i}", [1], 1), p, rng.integers(0, vocab, n).tolist(),
                      np.arange(at, at + p + n), sample=True)
        (plan.extends if kind == "e" else plan.decodes).append(seg)
        at += p + n
    return plan


def time_point(ex: TorchExecutor, point: Point, repeats: int, rng: np.random.Generator,
               budget_s: float = math.inf, warm: bool = True) -> float:
    """Mean of up to `repeats` back-to-back TorchExecutor.run calls on this step, none started
    once the timed ones add up to `budget_s`; when `warm`, after untimed runs adding up to
    WARM_S (at most WARM_RUNS, at least one): a decode after other steps takes ~10 runs to
    settle (a one-request decode at a 1,280-token context after a 2,048-token prefill: 5.6 ms,
    then 3.7, 3.3, 3.0 ms, 2.4 ms ten runs on), and a real run's decodes mostly follow decodes.
    Back to back, as a real run's steps are: the scheduler's work between them leaves the
    weights and the running requests' KV in the CPU caches (a decode of one 64-token context: 0.53 ms warm, 2.0 ms
    after writing 64 MiB elsewhere; real runs' decodes took 0.5-0.6 ms). The mean, not the
    minimum: a real run's steps share the machine as these do, stalls included, and what a
    simulation adds up is their expected time."""
    plan = plan_of(point, ex.kv.num_slots, ex.args.vocab_size, rng)
    spent, n = 0.0, 0
    while warm and n < WARM_RUNS and (n == 0 or spent < WARM_S):
        spent, n = spent + ex.run(plan).duration, n + 1
    runs: list[float] = []
    while not runs or (len(runs) < repeats and sum(runs) < budget_s):
        runs.append(ex.run(plan).duration)
    return float(np.mean(runs))


def time_passes(time_one: Callable[[Point, bool], float], points: Sequence[Point], passes: int,
                rng: np.random.Generator, progress: Callable[[int, int], object] | None = None
                ) -> list[list[float]]:
    """Each point's time in each of `passes` passes over the grid: the first in grid order,
    the others in a fresh random order. `time_one(point, warm)`: warm is False for a point
    whose first pass took over COLD_RUN_S, where a warm-up run would cost more than it warms."""
    times: list[list[float]] = [[] for _ in points]
    order = list(range(len(points)))
    for k in range(passes):
        for j, i in enumerate(order):
            times[i].append(time_one(points[i], not times[i] or times[i][0] < COLD_RUN_S))
            if progress is not None:
                progress(k * len(points) + j + 1, passes * len(points))
        order = [int(i) for i in rng.permutation(len(points))]
    return times


def _affinity() -> list[int] | None:
    """The CPUs this process may run on: a profile holds where it was measured (taskset -c N)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:                      # not offered on this platform
        return None


def machine_info(device: torch.device) -> dict:
    return {"host": platform.node(), "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "affinity": _affinity(),
            "cuda": torch.version.cuda if device.type == "cuda" else None,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def calibrate(ex: TorchExecutor, grid: Grid,
              progress: Callable[[int, int], object] | None = None) -> Profile:
    """Time every grid point on `ex` (whose pool must hold pool_slots(grid.points())) and fit."""
    points = grid.points()
    need = pool_slots(points)
    if ex.kv.num_slots < need:
        raise ValueError(f"calibration needs a KV pool of {need:,} slots, the executor has "
                         f"{ex.kv.num_slots:,}")
    rng = np.random.default_rng(grid.seed)
    time_point(ex, points[-1], 1, rng)                      # warm-up: allocator, kernels
    times = time_passes(lambda pt, warm: time_point(
        ex, pt, grid.repeats, rng, grid.repeat_budget_s / grid.passes, warm), points,
        grid.passes, rng, progress)
    samples = [Sample(pt[0], pt[1], float(np.median(ts)), tuple(ts))
               for pt, ts in zip(points, times)]
    spec_dtype = str(ex.dtype).removeprefix("torch.")
    spec = ModelSpec(ex.args, tp=1, dtype_bytes=ex.dtype.itemsize)
    coef, res, spill = fit_spill(spec, samples)
    # the context decode batches are looked up at: whichever prices the held-out ones better
    held, decode_at = min(((held_out(spec, samples, coef, spill, decode_at=at), at)
                           for at in DECODE_AT), key=lambda h: h[0].rms if h[0] else 0.0)
    dev = ex.device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else (platform.processor()
                                                                        or platform.machine())
    return Profile(model=ex.args, dtype=spec_dtype, dtype_bytes=ex.dtype.itemsize,
                   device=dev.type, device_name=name, backend=ex.attention.name,
                   machine=machine_info(dev), grid=grid.as_dict(), coefficients=coef,
                   residuals=res, samples=tuple(samples), spill_bytes=spill,
                   corrected=True, held_out=held, decode_at=decode_at)
