"""MeasuredCostModel: CostModel's step-time interface priced from measured kernel tables
(radixkv.sim.tables) instead of the roofline.

A step of prefill segments (p_i, n_i) and b decodes whose contexts sum to C is

  step_time = shared(T) + a0 + sum_i (ctx_attn(n_i, p_i) - a0) + dec_attn(b, C / b)
              + step_overhead_s                 (the a0 terms only when there is a prefill)

with T = sum n_i + b the step's tokens: the GEMMs, norms and all-reduces run once over all
of the step's tokens; each prefill segment's attention is its own work (its queries attend
to its own prefix, as a varlen attention kernel runs them), but the kernels' fixed cost
a0 = ctx_attn(1, 0) (launches, one per layer) is paid once per step, not per segment; the
decodes' attention is priced at their mean context. Between grid points every table is interpolated linearly in log-log
coordinates (the exact curve for a power law; prefixes and contexts as log(1 + x)), and
beyond the grid extended along its last segment. The tables' figures are whole engine
steps measured on the GPU, so the host overhead defaults to 0.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from radixkv.sim.costmodel import _check_contexts, _check_segments
from radixkv.sim.ratio_grid import axis_cell
from radixkv.sim.specs import GPUSpec, ModelSpec, kv_capacity_tokens
from radixkv.sim.tables import (CTX_NEW, CTX_PREFIX, DEC_BATCH, DEC_CTX, TOKENS, TimingTable)
from radixkv.argcheck import finite_at_least


def _axis(xs: Sequence[int], shift: int) -> tuple[float, ...]:
    return tuple(math.log(x + shift) for x in xs)


def _logs(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(math.log(max(v, 1e-6)) for v in values)


@dataclass(frozen=True)
class _Curve:
    axis: tuple[float, ...]
    logs: tuple[float, ...]
    shift: int

    def __call__(self, x: float) -> float:
        i, w = axis_cell(self.axis, math.log(x + self.shift))
        return math.exp(self.logs[i] + w * (self.logs[i + 1] - self.logs[i]))


@dataclass(frozen=True)
class _Surface:
    rows: tuple[float, ...]
    cols: tuple[float, ...]
    logs: tuple[tuple[float, ...], ...]
    row_shift: int
    col_shift: int

    def __call__(self, x: float, y: float) -> float:
        i, wx = axis_cell(self.rows, math.log(x + self.row_shift))
        j, wy = axis_cell(self.cols, math.log(y + self.col_shift))
        a, b = self.logs[i], self.logs[i + 1]
        lo = a[j] + wy * (a[j + 1] - a[j])
        hi = b[j] + wy * (b[j + 1] - b[j])
        return math.exp(lo + wx * (hi - lo))


@dataclass(frozen=True)
class MeasuredCostModel:
    model_spec: ModelSpec
    gpu: GPUSpec
    table: TimingTable
    step_overhead_s: float = 0.0
    _shared: _Curve = field(init=False, repr=False)
    _ctx: _Surface = field(init=False, repr=False)
    _dec: _Surface = field(init=False, repr=False)
    _memo: dict = field(init=False, repr=False, compare=False)
    _a0: float = field(init=False, repr=False)

    def __post_init__(self):
        finite_at_least(self.step_overhead_s, "step_overhead_s", 0)
        t = self.table
        object.__setattr__(self, "_shared", _Curve(_axis(TOKENS, 0), _logs(t.shared_ms), 0))
        object.__setattr__(self, "_ctx", _Surface(_axis(CTX_NEW, 0), _axis(CTX_PREFIX, 1),
                                                  tuple(_logs(r) for r in t.ctx_attn_ms), 0, 1))
        object.__setattr__(self, "_dec", _Surface(_axis(DEC_BATCH, 0), _axis(DEC_CTX, 1),
                                                  tuple(_logs(r) for r in t.dec_attn_ms), 0, 1))
        object.__setattr__(self, "_memo", {})
        object.__setattr__(self, "_a0", t.ctx_attn_ms[0][0])     # one new token, no prefix

    @property
    def label(self) -> str:
        return f"{self.model_spec.name}@{self.gpu.name} ({self.timing})"

    @property
    def timing(self) -> str:
        """What prices the steps, as every output's metadata names it."""
        return f"measured: {self.table.label}"

    @property
    def device_name(self) -> str:
        return self.gpu.name

    # ---- the three parts, ms ---------------------------------------------------------------
    def shared_ms(self, tokens: int) -> float:
        memo = self._memo
        v = memo.get(tokens)
        if v is None:
            v = memo[tokens] = self._shared(tokens)
        return v

    def ctx_attn_ms(self, new: int, prefix: int) -> float:
        key = (new, prefix)
        memo = self._memo
        v = memo.get(key)
        if v is None:
            if len(memo) > 200_000:
                memo.clear()
            v = memo[key] = self._ctx(new, prefix)
        return v

    def dec_attn_ms(self, batch: int, ctx_sum: int) -> float:
        return self._dec(batch, ctx_sum / batch) if batch else 0.0

    # ---- times -----------------------------------------------------------------------------
    def step_time(self, prefill_segments: Sequence[tuple[int, int]] = (),
                  decode_context_lens: Sequence[int] = ()) -> float:
        """Seconds for one engine step; 0.0 for an empty step."""
        if not prefill_segments and not decode_context_lens:
            return 0.0
        _check_segments(prefill_segments)
        _check_contexts(decode_context_lens)
        b = len(decode_context_lens)
        ms = self.dec_attn_ms(b, sum(decode_context_lens))
        tokens = b
        if prefill_segments:
            a0 = self._a0
            ms += a0
            for p, n in prefill_segments:
                tokens += n
                ms += max(self.ctx_attn_ms(n, p) - a0, 0.0)
        return (self.shared_ms(tokens) + ms) / 1e3 + self.step_overhead_s

    def decode_step_time(self, batch: int, ctx_sum: int, ctx_max: int) -> float:
        """step_time((), contexts) from len and sum of the contexts, to the bit."""
        return (self.shared_ms(batch) + self.dec_attn_ms(batch, ctx_sum)) / 1e3 \
            + self.step_overhead_s

    def prefill_time(self, segments: Sequence[tuple[int, int]]) -> float:
        return self.step_time(segments, ()) - (self.step_overhead_s if segments else 0.0)

    def decode_time(self, context_lens: Sequence[int]) -> float:
        return self.step_time((), context_lens) - (self.step_overhead_s if context_lens else 0.0)

    def recompute_s(self, depth: int, n: int) -> float:
        """Seconds of n tokens' prefill after depth cached ones (the `cost` eviction order)."""
        return self.prefill_time([(depth, n)])


DEFAULT_TIMING = "vllm"


def named_cost(model: str, gpu: str, tp: int | None = None, timing: str | None = None):
    """The step prices of a named model on a named GPU: the measured tables of `timing`
    (default: the newest vLLM release's) where they cover the pair, else the roofline,
    whose `timing` then says why."""
    from radixkv.sim.costmodel import CostModel
    from radixkv.sim.tables import Timing, covered, load_table
    choice = Timing.parse(DEFAULT_TIMING if timing is None else timing)
    roof = CostModel.named(model, gpu, tp=tp)
    hit = covered(model, roof.model_spec, gpu, choice)
    if hit is None:
        if choice.backend != "roofline":
            return CostModel(roof.model_spec, roof.gpu,
                             uncovered=f"no {choice.label} tables for {roof.label}")
        return roof
    aic_model, system, version = hit
    table = load_table(aic_model, system, choice.backend, version, roof.model_spec.tp)
    return MeasuredCostModel(roof.model_spec, roof.gpu, table)


class NamedReplica(NamedTuple):
    """A named model on a named GPU at a TP degree: its step prices and the KV pool the engine
    would allocate there."""
    cost: Any                     # MeasuredCostModel, or the roofline CostModel
    kv_capacity: int              # tokens
    kv_source: str                # how kv_capacity was reached
    gpu_bytes: int


def named_replica(model: str, gpu: str, tp: int | None = None,
                  timing: str | None = None) -> NamedReplica:
    cost = named_cost(model, gpu, tp=tp, timing=timing)
    if isinstance(cost, MeasuredCostModel):
        mem = cost.table.kv_memory
        gpu_bytes = mem["gpu_bytes"]
        return NamedReplica(cost, cost.table.kv_capacity_tokens,
                            f"{cost.table.backend} {cost.table.version} on {gpu}: "
                            f"{mem['memory_fraction']:g} of {gpu_bytes / 2**30:.0f} GiB less "
                            f"weights, activations and runtime reserve", gpu_bytes)
    return NamedReplica(cost, kv_capacity_tokens(cost.model_spec, cost.gpu),
                        f"0.9 of {gpu} memory less weights", cost.gpu.hbm_bytes)
