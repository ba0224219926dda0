"""Run workloads through the engine on a simulated GPU: one configuration, or several side by
side on the same arrivals (`compare`). Open loop, requests arrive at the trace's times, or with
session arrivals (`arrivals`) each later turn of a session a think time after its previous turn
finished; closed loop (`max_concurrency`), N clients each send their next request when the
previous one finishes (radixkv.engine.clients)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.engine.clients import ClosedLoop, SessionLoop
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.engine.metrics import EngineReport
from radixkv.offline.replay import collector_paused
from radixkv.sched.request import Request
from radixkv.sim.costmodel import CostModel
from radixkv.sim.executor import SimExecutor
from radixkv.sim.oracle import FutureOracle
from radixkv.workloads.sessions import SessionArrivals


def build_requests(workload) -> list[Request]:
    return [request_from_trace(tr, i) for i, tr in enumerate(workload)]


def run_config(workload, cfg: EngineConfig, cost: CostModel,
               progress: Callable[[int], object] | None = None,
               max_concurrency: int | None = None,
               arrivals: SessionArrivals | None = None) -> EngineReport:
    """Simulate one configuration on a workload; a fresh cache, pool and scheduler each time.
    `max_concurrency` N: closed loop, N clients in place of the arrival times; `arrivals`:
    session arrivals (engine/clients.py's SessionLoop)."""
    if max_concurrency is not None and arrivals is not None:
        raise ValueError("session arrivals are open loop and max_concurrency is closed loop; "
                         "give one or the other")
    reqs = build_requests(workload)
    on_admit, extra = None, {}
    if cfg.cache.eviction == "belady":
        # The oracle's future is the order of Request.index, the trace order. Open loop, that
        # is the arrival order. Closed loop, the arrival order is only known as the run goes;
        # each client sends its requests in trace order and the clients advance through the
        # trace together, so trace order is the oracle's estimate of it: exact per client,
        # approximate across clients (a fast client may run ahead of a slow one). Session
        # arrivals likewise: trace order is exact within a session, an estimate across them.
        oracle = FutureOracle(reqs, cfg.cache.page_size)
        on_admit, extra = oracle.admitted, {"oracle": oracle, "clock": logical_clock()}
    else:
        extra = {"clock": logical_clock()} if cfg.cache.kind == "radix" else {}
    if cfg.cache.eviction == "cost":
        # recompute time of a leaf's tokens at its depth, from the cost model
        extra["token_cost"] = cost.recompute_s
    sessions = [tr.session for tr in workload]
    loop: ClosedLoop | SessionLoop | None = None
    if arrivals is not None:
        loop = SessionLoop(reqs, sessions, arrivals)
    elif max_concurrency is not None:
        loop = ClosedLoop(reqs, sessions, max_concurrency)
    engine = Engine(cfg, cfg.cache.build(**extra), SimExecutor(cost), on_admit=on_admit,
                    on_finish=None if loop is None else loop.finished)
    if loop is None:
        for r in reqs:
            engine.add_request(r)
    else:
        loop.start(engine)
    with collector_paused():
        return engine.run_until_idle(progress=progress)


def logical_clock() -> Callable[[], int]:
    # the tree's recency clock: a counter, so LRU order is exact and runs are deterministic
    n = iter(range(1 << 62))
    return n.__next__


@dataclass(frozen=True)
class ReferenceRun:
    """The default experiment of `radixkv simulate` and `radixkv compare`: the support agent
    at a load and KV pool where the queue backs up and eviction fires (1,200 requests, 4
    sessions/s, 100,000 KV tokens ~ 12.2 GiB of Llama-3-8B KV)."""
    workload: str = "support"
    rate: float = 4.0                     # sessions per second, for `workload` only
    max_total_tokens: int = 100_000

    def generator_defaults(self, spec: str) -> dict:
        return {"rate": self.rate} if spec == self.workload else {}

    def pool(self, spec: str) -> int | None:
        """The KV pool of the reference experiment for its own workload; None elsewhere (the
        engine's allocation on the GPU then)."""
        return self.max_total_tokens if spec == self.workload else None


REFERENCE = ReferenceRun()


@dataclass(frozen=True)
class Named:
    name: str
    cfg: EngineConfig


def reference_configs(kv_capacity: int, sched: SchedulerConfig | None = None) -> list[Named]:
    """The six-way comparison: SGLang's defaults, a cache-aware schedule, pages, no cache,
    vLLM-style block hashing, and the future-aware oracle. `sched` is every configuration's
    scheduler (the second orders by lpm); each pool is `kv_capacity` in whole pages."""
    s = sched or SchedulerConfig()
    designs = [(CacheConfig("radix", 1, "lru"), s), (CacheConfig("radix", 1, "slru"),
                                                     replace(s, policy="lpm")),
               (CacheConfig("radix", 16, "lru"), s), (CacheConfig("none", 1), s),
               (CacheConfig("blockhash", 16, "lru"), s), (CacheConfig("radix", 1, "belady"), s)]
    out = []
    for i, (cache, sched_i) in enumerate(designs, 1):
        name = f"{i} {_design_name(cache, sched_i.policy)}"
        if kv_capacity < cache.page_size:
            raise ValueError(f"a KV pool of {kv_capacity:,} tokens is smaller than one page of "
                             f"{cache.page_size} tokens ({name})")
        tokens = kv_capacity - kv_capacity % cache.page_size
        out.append(Named(name, EngineConfig(kv_capacity=tokens, cache=cache, sched=sched_i,
                                            name=name)))
    return out


def _design_name(cache: CacheConfig, policy: str) -> str:
    """"radix fcfs lru p1", "no cache", "blockhash16 fcfs"."""
    if cache.kind == "none":
        return "no cache"
    if cache.kind == "blockhash":
        return f"blockhash{cache.page_size} {policy}"
    return f"{cache.kind} {policy} {cache.eviction} p{cache.page_size}"


def compare(workload, configs: Sequence[Named], cost: CostModel,
            progress: Callable[[str, int], object] | None = None,
            max_concurrency: int | None = None,
            arrivals: SessionArrivals | None = None) -> list[tuple[Named, EngineReport]]:
    out = []
    for nc in configs:
        cb = (lambda k, n=nc.name: progress(n, k)) if progress else None
        out.append((nc, run_config(workload, nc.cfg.with_(name=nc.name), cost, cb,
                                   max_concurrency, arrivals)))
    return out
