"""Where `radixkv plan` simulates its candidates: this machine's processes, or a Ray cluster.
Every simulation is deterministic, so a batch gives the same outcomes on either, in any order.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import NamedTuple

from radixkv.offline.replay import collect_simulation
from radixkv.offline.planning.space import Candidate, Setting
from radixkv.offline.cluster.compare import run_one
from radixkv.workloads import TraceRequest


class Outcome(NamedTuple):
    """What one simulation of a candidate said."""
    ttft_p99: float | None
    itl_p99: float | None
    e2e_p99: float | None
    hit_rate: float
    makespan_s: float


class Job(NamedTuple):
    candidate: Candidate
    load: float = 1.0              # arrival rate as a multiple of the trace's
    cache_off: bool = False        # the same configuration without a prefix cache


def at_load(requests: Sequence[TraceRequest], load: float) -> list[TraceRequest]:
    """The requests arriving `load` times as fast (the same order and gaps, scaled)."""
    if load == 1.0:
        return list(requests)
    t0 = min((r.arrival for r in requests), default=0.0)
    return [dataclasses.replace(r, arrival=t0 + (r.arrival - t0) / load) for r in requests]


def simulate(requests: Sequence[TraceRequest], setting: Setting, job: Job) -> Outcome:
    cand = job.candidate
    fam = cand.family.with_cache("none") if job.cache_off else cand.family
    cand = dataclasses.replace(cand, family=fam)
    cost = setting.replica(fam.gpu, fam.tp).cost
    res = run_one(at_load(requests, job.load), setting.config(cand), fam.router, cost)
    collect_simulation()
    d = res.details
    return Outcome(res.ttft_p99, d.get("itl_p99"), res.e2e_p99, res.hit_rate,
                   d.get("makespan_s") or 0.0)


_REQUESTS: list[TraceRequest] = []


def _keep(requests: list[TraceRequest]) -> None:
    global _REQUESTS
    _REQUESTS = requests


def _one(setting: Setting, job: Job) -> Outcome:
    return simulate(_REQUESTS, setting, job)


class LocalRunner:
    """A process pool of this machine (forked once, before any thread: the workers share the
    trace); one process runs in place."""

    def __init__(self, requests: list[TraceRequest], setting: Setting, workers: int | None):
        self.requests, self.setting = requests, setting
        self.workers = workers or os.cpu_count() or 1
        self._pool = None
        if self.workers > 1:
            _keep(requests)
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("fork"))

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        if self._pool is None:
            return [simulate(self.requests, self.setting, j) for j in jobs]
        return list(self._pool.map(_one, [self.setting] * len(jobs), jobs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)


class RayRunner:
    """Ray tasks, one per simulation, on the cluster `ray.init` joins (a local one when none
    is running); the trace is put in the object store once."""

    def __init__(self, requests: list[TraceRequest], setting: Setting, address: str | None):
        import ray
        self.ray, self.setting = ray, setting
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False)
        self._ref = ray.put(requests)
        self._task = ray.remote(simulate)

    def run(self, jobs: Sequence[Job]) -> list[Outcome]:
        return self.ray.get([self._task.remote(self._ref, self.setting, j) for j in jobs])

    def close(self) -> None:
        self.ray.shutdown()
