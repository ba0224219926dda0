"""How close the profiled simulator is to the real engine: one workload through Engine +
TorchExecutor and through Engine + SimExecutor priced by a profile, same configuration, same
requests (recorded replies forced in both), metrics side by side.

Both clocks measure the same thing: the engine advances its clock by each step's duration,
which for the torch executor is the wall time of TorchExecutor.run (packing, the forward,
sampling; the scheduler's own Python time is outside both) and for the simulator the
profile's step time; between steps both jump to the next arrival when idle.

The real side is the median of several timed runs after one untimed pass of the same workload
(run_real_runs). The profile prices warm steps, and a process's first step of each new largest
shape is not one: on tiny-llama, burst's 63-segment prefill took 625-711 ms in a process's
first pass and 238-255 ms in the next ones. And one run is a noisy reference: tree's E2E p90
(the fourth-slowest of 39 requests) spread 73 % over five warm runs, as a few milliseconds more
or less reorder which requests share a decode batch.
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
from radixkv.argcheck import positive_int

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


def figures(rep: EngineReport, busy: float) -> dict[str, float]:
    """A run's METRICS and EXTRA: its report's figures and the executor's busy seconds."""
    s = rep.summary()
    return {**{m: float(s[m] or 0.0) for m in METRICS}, "busy_s": float(busy)}


@dataclass(frozen=True)
class RealRuns:
    """The timed runs of one workload on the real engine (run_real_runs): each one's figures,
    the untimed first pass's apart."""
    runs: tuple[dict[str, float], ...]
    cold: dict[str, float]           # the untimed pass: every step shape met for the first time
    requests: int

    def median(self) -> dict[str, float]:
        return {m: float(np.median([r[m] for r in self.runs])) for m in METRICS + EXTRA}

    def spread(self) -> dict[str, float]:
        """(largest - smallest) / median of each figure over the runs: the real engine's own
        disagreement with itself, the floor under any simulator's error."""
        med = self.median()
        return {m: (max(r[m] for r in self.runs) - min(r[m] for r in self.runs)) / med[m]
                if med[m] else 0.0 for m in med}


def compare(real: dict[str, float], sim: dict[str, float]) -> Fidelity:
    """Each figure of METRICS and EXTRA, real against simulated."""
    rows = tuple(MetricError(m, real[m], sim[m]) for m in METRICS + EXTRA)
    return Fidelity(rows, real, sim)


def compare_reports(real: EngineReport, real_busy: float, sim: EngineReport,
                    sim_busy: float) -> Fidelity:
    """One real run against one simulated, after checking both finished the same requests."""
    check_requests(real.summary()["requests"], sim)
    return compare(figures(real, real_busy), figures(sim, sim_busy))


def check_requests(real: int, sim: EngineReport) -> None:
    done = sim.summary()["requests"]
    if real != done:
        raise ValueError(f"the real run finished {real} requests, the simulated {done}")


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
    """The workload through the engine on a TorchExecutor after a few warm-up steps:
    (report, executor busy seconds)."""
    warm_up(ex, ex.args.vocab_size)
    if isinstance(ex, StepLog):
        ex.steps.clear()                  # the warm-up's steps are not the run's
    return _timed_run(workload, cfg, ex)


def _timed_run(workload, cfg: EngineConfig, ex) -> tuple[EngineReport, float]:
    busy0 = ex.busy_s
    rep = _run(workload, cfg, ex)
    return rep, ex.busy_s - busy0


def run_real_runs(workload, cfg: EngineConfig, ex, runs: int) -> RealRuns:
    """One untimed pass of the workload through the engine on a TorchExecutor, then `runs`
    timed ones (module doc). A StepLog keeps the timed runs' steps only."""
    positive_int(runs, "real runs")
    cold_rep, cold_busy = run_real(workload, cfg, ex)
    if isinstance(ex, StepLog):
        ex.steps.clear()
    out = tuple(figures(*_timed_run(workload, cfg, ex)) for _ in range(runs))
    return RealRuns(out, figures(cold_rep, cold_busy), cold_rep.summary()["requests"])


def speed_check(ex, profile, points: int = 12, seed: int = 0) -> float:
    """The machine's speed now against the profile's: the median of (time now / time in the
    profile) over `points` of its grid samples re-timed on `ex` as calibrate timed them
    (cheap ones, under 50 ms, whose slots fit the executor's pool). 1.3: steps take 30 %
    longer than when the profile was measured (a shared machine, another core, a drift)."""
    from radixkv.offline.calibration.measure import pool_slots, time_point   # torch: only here
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
