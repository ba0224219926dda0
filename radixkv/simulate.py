"""Run workloads through the engine on a simulated GPU: one configuration, or several side by
side on the same arrivals (`compare`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.sim.costmodel import CostModel
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.sim.executor import SimExecutor
from radixkv.engine.metrics import EngineReport
from radixkv.sim.oracle import FutureOracle
from radixkv.sched.request import Request


def build_requests(workload) -> list[Request]:
    return [request_from_trace(tr, i) for i, tr in enumerate(workload)]


def run_config(workload, cfg: EngineConfig, cost: CostModel,
               progress: Callable[[int], object] | None = None) -> EngineReport:
    """Simulate one configuration on a workload; a fresh cache, pool and scheduler each time."""
    reqs = build_requests(workload)
    on_admit, extra = None, {}
    if cfg.cache.eviction == "belady":
        oracle = FutureOracle(reqs, cfg.cache.page_size)
        on_admit, extra = oracle.admitted, {"oracle": oracle, "clock": _logical_clock()}
    else:
        extra = {"clock": _logical_clock()} if cfg.cache.kind == "radix" else {}
    engine = Engine(cfg, cfg.cache.build(**extra), SimExecutor(cost), on_admit=on_admit)
    for r in reqs:
        engine.add_request(r)
    return engine.run_until_idle(progress=progress)


def _logical_clock() -> Callable[[], int]:
    # the tree's recency clock: a counter, so LRU order is exact and runs are deterministic
    n = iter(range(1 << 62))
    return n.__next__


@dataclass(frozen=True)
class Named:
    name: str
    cfg: EngineConfig


def reference_configs(kv_capacity: int, sched: SchedulerConfig | None = None) -> list[Named]:
    """The six-way comparison: SGLang's defaults, a cache-aware schedule, pages, no cache,
    vLLM-style block hashing, and the future-aware oracle."""
    s = sched or SchedulerConfig()
    mk = lambda name, cache, **kw: Named(name, EngineConfig(  # noqa: E731
        kv_capacity=kv_capacity, cache=cache, sched=s.__class__(**{**s.__dict__, **kw}), name=name))
    return [
        mk("1 radix fcfs lru p1", CacheConfig("radix", 1, "lru")),
        mk("2 radix lpm slru p1", CacheConfig("radix", 1, "slru"), policy="lpm"),
        mk("3 radix fcfs lru p16", CacheConfig("radix", 16, "lru")),
        mk("4 no cache", CacheConfig("none", 1)),
        mk("5 blockhash16 fcfs", CacheConfig("blockhash", 16, "lru")),
        mk("6 radix fcfs belady p1", CacheConfig("radix", 1, "belady")),
    ]


def compare(workload, configs: Sequence[Named], cost: CostModel,
            progress: Callable[[str, int], object] | None = None) -> list[tuple[Named, EngineReport]]:
    out = []
    for nc in configs:
        cb = (lambda k, n=nc.name: progress(n, k)) if progress else None
        out.append((nc, run_config(workload, nc.cfg.with_(name=nc.name), cost, cb)))
    return out
