"""What a profile's linear form misses, measured: its ratio to each timed step of the
calibration grid, interpolated between the grid's points.

The linear form (radixkv.sim.profile) prices a step from its work. On a CPU the same work
costs more or less with where its bytes sit (a decode grid inside the L2 cache against one
streaming from DRAM, a small prefill's mask and kernel path), so its error at the grid's
points is systematic, not noise: +15 % on single decodes, -25 % on four 4k-context ones. The
grid is two tables of uniform steps:

  decode:  B requests at context c                 axes (log B, log(1 + c))
  prefill: B segments of n new after p cached      axes (log(1 + n), log(1 + p), log B)

and at each point the log ratio rho = log(measured / linear) is kept. A step is priced as
linear(step) * exp(rho(z)), rho interpolated multilinearly at the step's coordinates z and
held at the edge value beyond the grid. A decode-only step is looked up at (its decodes, one
context: `decode_at`, their longest or their mean), a step whose prefill segments are all
alike at (their number, new and cached tokens); the decodes riding along stay with the linear
form. Calibration keeps whichever context prices the grid's mixed decode batches better: on a
padded-gather backend the longest, as every row is gathered and attended at that width (one
CPU profile's 22 held-out mixed batches: 6.8 % rms against 11.2 % at the mean; a replayed
trace's decodes of 2-4 requests: +5.5 % against +9.9 % in all, +11.3 % against +18.2 % where
the longest context is over twice the mean). A profile that does not say looks up the mean.
Prefill segments that differ are priced by the linear form alone:
every way of looking such a batch up in the uniform table priced the grid's mixed batches
worse than the linear form did (the segment of the longest context: 39 % rms, one +146 %;
each segment's ratio weighted by its share of the work: 15 % rms; the linear form: 9 %),
since a uniform batch of short segments after long prefixes gathers every sequence's long
context while a mixed one pads most of its rows from one masked slot.
A grid point without a sample (a step over the caps) takes its nearest measured neighbour's
ratio, in grid steps (on a tie the first in grid order: the smaller batch at the same
context). The grid's mixed batches (one long segment beside short ones, mixed decode
contexts) are in no table: they are the held-out check of how well steps off the grid are
priced.
"""
from __future__ import annotations

import itertools
import math
from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

Step = tuple[Sequence[tuple[int, int]], Sequence[int]]      # (prefill segments, decode contexts)
DECODE_AT = ("mean", "max")      # the context a decode batch is looked up at (module doc)


def check_decode_at(v, what: str) -> str:
    """`v` if it is one of DECODE_AT, else a ValueError naming `what` and the value."""
    if v not in DECODE_AT:
        raise ValueError(f"{what} decode_at must be one of {', '.join(DECODE_AT)}, got {v!r}")
    return v


def axis_cell(axis: Sequence[float], u: float) -> tuple[int, float]:
    """The segment [i, i+1] of the axis holding u (the end ones beyond it) and u's weight
    (outside [0, 1] beyond the axis): also radixkv.sim.measured's table lookup."""
    i = min(max(bisect_right(axis, u) - 1, 0), len(axis) - 2)
    return i, (u - axis[i]) / (axis[i + 1] - axis[i])


def decode_coords(batch: int, ctx: float) -> tuple[float, float]:
    """A decode batch's coordinates: its size and the context it is looked up at."""
    return (math.log(batch), math.log1p(ctx))


def prefill_coords(segment: tuple[int, int], batch: int) -> tuple[float, float, float]:
    """A prefill segment's coordinates in a batch of `batch` segments: new, cached, batch."""
    p, n = segment
    return (math.log1p(n), math.log1p(p), math.log(batch))


class _Table:
    """rho on the grid axes[0] x axes[1] x ... (log coordinates), missing points filled."""

    def __init__(self, points: dict[tuple[float, ...], float]):
        dims = len(next(iter(points)))
        self.axes = [tuple(sorted({k[d] for k in points})) for d in range(dims)]
        shape = tuple(len(a) for a in self.axes)
        rho, have = np.zeros(shape), np.zeros(shape, dtype=bool)
        for k, r in points.items():
            idx = tuple(int(np.searchsorted(a, x)) for a, x in zip(self.axes, k))
            rho[idx], have[idx] = r, True
        got = np.argwhere(have)
        for idx in np.argwhere(~have):              # nearest measured point, in grid steps
            rho[tuple(idx)] = rho[tuple(got[np.argmin(((got - idx) ** 2).sum(1))])]
        self.rho = rho

    def __call__(self, z: Sequence[float]) -> float:
        cells = []                                  # (lower index, weight of the upper one)
        for a, x in zip(self.axes, z):
            if len(a) == 1:
                cells.append((0, 0.0))
            else:
                i, w = axis_cell(a, x)
                cells.append((i, min(max(w, 0.0), 1.0)))     # held at the edges
        out = 0.0
        for ups in itertools.product((0, 1), repeat=len(cells)):
            w = math.prod(t if up else 1.0 - t for (_, t), up in zip(cells, ups))
            if w:
                out += w * float(self.rho[tuple(i + up for (i, _), up in zip(cells, ups))])
        return out


class RatioGrid:
    """The measured ratio to the linear form on the calibration grid (module doc)."""

    def __init__(self, steps: Sequence[Step], log_ratios: Sequence[float],
                 decode_at: str = "mean"):
        self.decode_at = check_decode_at(decode_at, "ratio grid:")
        dec: dict[tuple[float, ...], float] = {}
        pre: dict[tuple[float, ...], float] = {}
        for (segs, ctxs), r in zip(steps, log_ratios):
            if not segs and len(set(ctxs)) == 1:
                dec[decode_coords(len(ctxs), ctxs[0])] = float(r)
            elif not ctxs and len(set(segs)) == 1:
                pre[prefill_coords(segs[0], len(segs))] = float(r)
        self.decode = _Table(dec) if dec else None
        self.prefill = _Table(pre) if pre else None

    @staticmethod
    def on_grid(step: Step) -> bool:
        """Whether a step is one of the tables' points: uniform, decode-only or prefill-only."""
        segs, ctxs = step
        return (not segs and len(set(ctxs)) == 1) or (not ctxs and len(set(segs)) == 1)

    def factor(self, segments: Sequence[tuple[int, int]], contexts: Sequence[int]) -> float:
        """What multiplies the linear price of the step (module doc)."""
        if not segments:
            return self.decode_factor(len(contexts), sum(contexts), max(contexts))
        if self.prefill is None or len(set(segments)) > 1:
            return 1.0
        return math.exp(self.prefill(prefill_coords(segments[0], len(segments))))

    def decode_factor(self, batch: int, ctx_sum: int, ctx_max: int) -> float:
        """factor() of `batch` decodes whose contexts sum to ctx_sum, the longest ctx_max."""
        if not self.decode:
            return 1.0
        ctx = ctx_max if self.decode_at == "max" else ctx_sum / batch
        return math.exp(self.decode(decode_coords(batch, ctx)))
