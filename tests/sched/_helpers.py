"""Shared builders for the scheduler / engine tests: a deterministic simulated engine."""
from __future__ import annotations

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.sim.costmodel import CostModel
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.sim.executor import SimExecutor
from radixkv.sim.oracle import FutureOracle
from radixkv.offline.simulate import logical_clock
from radixkv.sched.batch import StepResult

COST = CostModel.named("llama-3-8b", "h100-sxm")


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def make_engine(kv_capacity: int = 200_000, cache: CacheConfig | None = None,
                sched: SchedulerConfig | None = None, check: bool = False,
                requests=None) -> Engine:
    """A SimExecutor engine with a logical cache clock. With eviction="belady", `requests`
    (all future requests) feed a FutureOracle wired as the cache's oracle and on_admit."""
    cache = cache or CacheConfig()
    cfg = EngineConfig(kv_capacity=kv_capacity, cache=cache, sched=sched or SchedulerConfig(),
                       check_invariants=check)
    extra, on_admit = {}, None
    if cache.kind == "radix":
        extra["clock"] = logical_clock()
    if cache.eviction == "belady":
        oracle = FutureOracle(list(requests), cache.page_size)
        extra["oracle"], on_admit = oracle, oracle.admitted
    return Engine(cfg, cache.build(**extra), Recorder(SimExecutor(COST)), on_admit=on_admit)


class Recorder:
    """Wraps an executor and records every plan it runs as a list of steps, each a list of
    (rid, prefix_len, n, sample, kind) per segment, kind "extend" or "decode"."""
    prices_decodes = False          # every step goes through run(), so every plan is recorded

    def __init__(self, inner):
        self.inner, self.name, self.steps = inner, inner.name, []

    def release(self, rid):
        self.inner.release(rid)

    def run(self, plan):
        self.steps.append([(s.req.rid, s.prefix_len, s.n, s.sample, "extend") for s in plan.extends]
                          + [(s.req.rid, s.prefix_len, s.n, s.sample, "decode") for s in plan.decodes])
        return self.inner.run(plan)

    def extends(self, i: int):
        return [seg for seg in self.steps[i] if seg[4] == "extend"]


def requests_of(workload, max_new_tokens=None):
    return [request_from_trace(tr, i, max_new_tokens=max_new_tokens) for i, tr in enumerate(workload)]


def fake_result(plan, dt: float = 0.01) -> StepResult:
    """What a SimExecutor returns, without the cost model: nothing sampled (scripted requests)."""
    return StepResult([None] * len(plan.segments), dt)


def make_scheduler(kv_capacity: int = 10_000, page_size: int = 1, kind: str = "radix", **sched_kw):
    """A Scheduler over a fresh cache and pool (no engine): drive it with schedule/process."""
    from radixkv.cache.manager import CacheManager
    from radixkv.cache.pool import SlotPool
    from radixkv.sched.scheduler import Scheduler
    kw = dict(max_prefill_tokens=100_000, chunked_prefill_size=0, dedup=False)
    kw.update(sched_kw)
    cache_cfg = CacheConfig(kind, page_size)
    cache = cache_cfg.build(clock=logical_clock()) if kind == "radix" else cache_cfg.build()
    return Scheduler(SchedulerConfig(**kw), CacheManager(cache, SlotPool(kv_capacity, page_size)))


def warm(sched, tokens) -> None:
    """Put `tokens` in the scheduler's cache as if a finished request had left them there."""
    from radixkv.cache.base import CacheReq
    from radixkv.cache.key import RadixKey
    req = CacheReq(RadixKey(tokens))
    assert sched.mgr.admit(req, req.key, len(req.key)) is not None
    sched.mgr.cache_req(req, finished=True)


def admitted_order(sched, now: float = 0.0):
    """rid of every extend segment of the next round, in admission order, with prefix_len."""
    plan = sched.schedule(now)
    return [(s.req.rid, s.prefix_len) for s in plan.extends] if plan else []
