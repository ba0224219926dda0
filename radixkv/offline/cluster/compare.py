"""Several routers on the same arrivals, each on a fresh cluster; on a process pool when more
than one worker is asked for (the runs are independent and deterministic, so the rows are the
same either way)."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context

from radixkv.offline.replay import collect_simulation
from radixkv.router import ROUTERS
from radixkv.offline.cluster.simulator import ClusterConfig, run_cluster
from radixkv.offline.cluster.disagg import DisaggConfig, run_disagg
from radixkv.offline.cluster.results import ClusterResult
from radixkv.router.base import StepCost
from radixkv.workloads.sessions import SessionArrivals

_WORKLOAD = None


def _init_worker(workload) -> None:
    global _WORKLOAD
    _WORKLOAD = workload


def _job(config: ClusterConfig | DisaggConfig, router: str, cost: StepCost,
         arrivals: SessionArrivals | None, options=None) -> ClusterResult:
    res = run_one(_WORKLOAD, config, router, cost, arrivals, options)
    collect_simulation()                   # a worker runs router after router
    return res


def run_one(workload, config: ClusterConfig | DisaggConfig, router: str, cost: StepCost,
            arrivals: SessionArrivals | None = None, options=None) -> ClusterResult:
    """One router's run on a fresh cluster, aggregated or disaggregated (`options`: the
    router's Options, None for its defaults)."""
    if isinstance(config, DisaggConfig):
        if arrivals is not None:
            raise ValueError("session arrivals are not simulated on a disaggregated cluster; "
                             "its requests arrive at their trace times")
        return run_disagg(workload, config, router, cost, options)
    return run_cluster(workload, config, router, cost, options, arrivals=arrivals)


def run_routers(workload, config: ClusterConfig | DisaggConfig, routers: Sequence[str], cost: StepCost,
                workers: int | None = None,
                done: Callable[[ClusterResult], object] | None = None,
                arrivals: SessionArrivals | None = None,
                options: dict | None = None) -> list[ClusterResult]:
    """One result per router, in the order given; `done` is called as each run ends;
    `arrivals`: session arrivals (router/cluster.py); `options`: router name -> its Options
    (router/options.py; a router not there runs on its defaults)."""
    options = options or {}
    for name in routers:
        ROUTERS.get(name)                       # an unknown name fails before any run
    if len(set(routers)) != len(routers):
        raise ValueError(f"a router is named twice: {' '.join(routers)}")
    n = min(workers or os.cpu_count() or 1, len(routers))
    out: dict[str, ClusterResult] = {}
    if n <= 1:
        for name in routers:
            out[name] = run_one(workload, config, name, cost, arrivals, options.get(name))
            collect_simulation()
            if done is not None:
                done(out[name])
        return [out[name] for name in routers]
    # spawn, not fork: the caller may run threads (a progress bar)
    with ProcessPoolExecutor(n, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(workload,)) as pool:
        pending = {pool.submit(_job, config, name, cost, arrivals, options.get(name)): name
                   for name in routers}
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    res = out[pending.pop(f)] = f.result()
                    if done is not None:
                        done(res)
        except BaseException:
            for f in pending:
                f.cancel()
            raise
    return [out[name] for name in routers]
