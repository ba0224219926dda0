"""How close the profiled simulator is to the real engine: one workload through Engine +
TorchExecutor and through Engine + SimExecutor priced by a profile, same configuration, same
requests (recorded replies forced in both), metrics side by side.

Both clocks measure the same thing: the engine advances its clock by each step's duration,
which for the torch executor is the wall time of TorchExecutor.run (packing, the forward,
sampling; the scheduler's own Python time is outside both) and for the simulator the
profile's step time; between steps both jump to the next arrival when idle.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from radixkv.config import CacheConfig, EngineConfig
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.engine.metrics import EngineReport
from radixkv.sched.request import Request
from radixkv.sim.executor import SimExecutor
from radixkv.sim.profile import ProfiledCostModel

METRICS = ("ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90", "makespan_s")
EXTRA = ("busy_s",)      # the executor's total step time: the plainest test of the step model


@dataclass(frozen=True)
class MetricError:
    metric: str
    real: float
    simulated: float

    @property
    def relative_error(self) -> float:
        """simulated / real - 1 (inf when real is 0 and simulated is not)."""
        if self.real == 0:
            return 0.0 if self.simulated == 0 else math.inf
        return self.simulated / self.real - 1

    def as_dict(self) -> dict:
        return {"real": self.real, "simulated": self.simulated,
                "relative_error": self.relative_error}


@dataclass(frozen=True)
class Fidelity:
    rows: tuple[MetricError, ...]
    real: dict                 # the real run's summary
    simulated: dict            # the simulated run's summary

    @property
    def worst(self) -> MetricError:
        """The row of METRICS with the largest |relative error|."""
        return max((r for r in self.rows if r.metric in METRICS),
                   key=lambda r: abs(r.relative_error))

    def within(self, tolerance: float) -> bool:
        return abs(self.worst.relative_error) <= tolerance


def compare_reports(real: EngineReport, real_busy: float, sim: EngineReport,
                    sim_busy: float) -> Fidelity:
    rs, ss = real.summary(), sim.summary()
    if rs["requests"] != ss["requests"]:
        raise ValueError(f"the real run finished {rs['requests']} requests, the simulated "
                         f"{ss['requests']}")
    rows = [MetricError(m, float(rs[m] or 0.0), float(ss[m] or 0.0)) for m in METRICS]
    rows.append(MetricError("busy_s", real_busy, sim_busy))
    return Fidelity(tuple(rows), rs, ss)


def warm_up(ex, vocab: int) -> None:
    """A few steps of assorted shapes, so first-call costs stay out of the measured run."""
    cfg = EngineConfig(kv_capacity=min(ex.kv.num_slots, 8192), cache=CacheConfig("none"))
    eng = Engine(cfg, cfg.cache.build(), ex)
    for i, n in enumerate((512, 64, 8)):
        eng.add_request(Request(f"warm{i}", [(7 * j + i) % vocab for j in range(n)], 4))
    eng.run_until_idle()


def _run(workload, cfg: EngineConfig, ex) -> EngineReport:
    eng = Engine(cfg, cfg.cache.build(), ex)
    for i, tr in enumerate(workload):
        eng.add_request(request_from_trace(tr, i))
    return eng.run_until_idle()


class StepLog:
    """An executor that records each step it runs: (prefill segments, decode contexts,
    seconds), everything else delegated to the executor it wraps."""

    def __init__(self, ex):
        self.inner = ex
        self.steps: list[tuple[tuple[tuple[int, int], ...], tuple[int, ...], float]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, plan):
        out = self.inner.run(plan)
        if plan.segments:
            self.steps.append((tuple((s.prefix_len, s.n) for s in plan.extends),
                               tuple(s.prefix_len for s in plan.decodes), out.duration))
        return out


STEP_KINDS = ("prefill", "prefill + decodes", "decode 1", "decode 2-4", "decode 5-16",
              "decode 17-64", "decode 65+")


def step_kind(segments, contexts) -> str:
    if segments:
        return "prefill + decodes" if contexts else "prefill"
    b = len(contexts)
    return ("decode 1" if b == 1 else "decode 2-4" if b <= 4 else "decode 5-16" if b <= 16
            else "decode 17-64" if b <= 64 else "decode 65+")


@dataclass(frozen=True)
class KindError:
    """The real steps of one kind against the profile's price of the same steps."""
    kind: str
    steps: int
    real_s: float
    priced_s: float
    share: float              # of the real run's busy seconds

    @property
    def relative_error(self) -> float:
        return self.priced_s / self.real_s - 1 if self.real_s else 0.0


def price_steps(steps, cost: ProfiledCostModel) -> list[KindError]:
    """Each kind of real step (STEP_KINDS) priced step by step by the profile: where its
    error comes from, apart from how the two runs' schedules differ."""
    total = sum(t for *_, t in steps) or 1.0
    acc: dict[str, list[float]] = {}
    for segs, ctxs, t in steps:
        a = acc.setdefault(step_kind(segs, ctxs), [0, 0.0, 0.0])
        a[0] += 1
        a[1] += t
        a[2] += cost.step_time(segs, ctxs)
    return [KindError(k, int(acc[k][0]), acc[k][1], acc[k][2], acc[k][1] / total)
            for k in STEP_KINDS if k in acc]


def run_real(workload, cfg: EngineConfig, ex) -> tuple[EngineReport, float]:
    """The workload through the engine on a TorchExecutor: (report, executor busy seconds)."""
    warm_up(ex, ex.args.vocab_size)
    if isinstance(ex, StepLog):
        ex.steps.clear()                  # the warm-up's steps are not the run's
    busy0 = ex.busy_s
    rep = _run(workload, cfg, ex)
    return rep, ex.busy_s - busy0


def speed_check(ex, profile, points: int = 12, seed: int = 0) -> float:
    """The machine's speed now against the profile's: the median of (time now / time in the
    profile) over `points` of its grid samples re-timed on `ex` as calibrate timed them
    (cheap ones, under 50 ms, whose slots fit the executor's pool). 1.3: steps take 30 %
    longer than when the profile was measured (a shared machine, another core, a drift)."""
    from radixkv.calibration.measure import pool_slots, time_point   # torch: only here
    from radixkv.sim.ratio_grid import RatioGrid

    cands = [s for s in profile.samples if s.seconds < 0.05 and RatioGrid.on_grid(
        (s.segments, s.contexts)) and pool_slots([(s.segments, s.contexts)]) <= ex.kv.num_slots]
    if not cands:
        raise ValueError("the profile has no grid step cheap enough to re-time, and this pool "
                         "holds none of its steps")
    pick = cands[::max(1, len(cands) // points)][:points]
    rng = np.random.default_rng(seed)
    ratios = [time_point(ex, (s.segments, s.contexts), 15, rng, 0.5) / s.seconds for s in pick]
    return float(np.median(ratios))


def run_simulated(workload, cfg: EngineConfig, cost: ProfiledCostModel) -> tuple[EngineReport, float]:
    """The same workload and configuration on the simulator: (report, simulated busy seconds)."""
    ex = SimExecutor(cost)
    return _run(workload, cfg, ex), ex.busy_s
