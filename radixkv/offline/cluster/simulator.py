"""The cluster simulator: N replicas, each an Engine (its own cache, pool, scheduler and
simulated GPU), behind one router, on one discrete-event clock.

Events in time order: a replica's step end (its outputs reach the router: KV events taken from
its cache, first tokens, finished requests; then it starts its next step), and a request's
arrival (routed on what the router has been told so far; sent to that replica). At equal times
step ends come first, replicas in index order. A replica's view is its state at its last step
end, plus the requests routed to it since. Deterministic for a seed.

Quiet steps skip the clock: a step that produced no first token or finish and ends by the next
arrival only refreshes the replica's view and leaves KV events, which nobody reads before that
arrival: the replica starts its next step at once, and the router hears those events just before
it routes the arrival (most steps are decodes, and under memory pressure most evict; the order
of router calls, and so every result, is the same as through the clock).

Session arrivals (`arrivals`): each later turn of a session arrives, and is routed, a think
time after its previous turn finished (workloads/sessions.py's `ArrivalQueue`). A finish can
then add an arrival sooner than the next one known, so a replica runs quiet steps only up to
the least think time still to come after the moment it steps (`ArrivalQueue.floor`): every
arrival a later finish adds lands after them.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from radixkv.cache.sim_hash import SIM_HASH
from radixkv.config import CacheConfig, EngineConfig
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.engine.metrics import EngineReport, RequestRecord, itl_percentiles
from radixkv.offline.replay import collector_paused
from radixkv.offline.simulate import logical_clock
from radixkv.router import ROUTERS, ReplicaView, RequestInfo, Router, RouterContext
from radixkv.router.base import StepCost
from radixkv.offline.cluster.results import ClusterResult, cluster_result
from radixkv.sched.request import Request, Status
from radixkv.sim.executor import SimExecutor
from radixkv.argcheck import int_at_least, positive_int
from radixkv.workloads.sessions import ArrivalQueue, SessionArrivals, SessionChain

_STEP_END, _ARRIVAL = 0, 1


def _runs(cache) -> list:
    """The KV-event runs a replica's cache recorded since the last take (none: no events)."""
    log = cache.events()
    return log.take_runs() if log is not None else []


@dataclass(frozen=True)
class ClusterConfig:
    """Replicas of one engine configuration (each with `engine.kv_capacity` KV slots)."""
    engine: EngineConfig
    replicas: int
    seed: int = 0

    def __post_init__(self):
        positive_int(self.replicas, "replicas")
        int_at_least(self.seed, "seed", 0)

    def context(self, cost: StepCost) -> RouterContext:
        c, s = self.event_cache(), self.engine.sched
        return RouterContext(self.replicas, c.page_size, c.hash_algo, self.seed, cost,
                             s.prefill_budget)

    def event_cache(self) -> CacheConfig:
        """The replicas' cache when the router reads KV events: publishing them, a radix
        cache's hashed with `sim64` (events that never leave the simulation: one vectorised
        hash per stored run, not a SHA-256 per page; the same pages match)."""
        c = replace(self.engine.cache, enable_events=True)
        return replace(c, hash_algo=SIM_HASH) if c.kind == "radix" else c


class Replica:
    """One engine and what the router has not been told yet of its last step."""

    def __init__(self, index: int, engine: Engine):
        self.index, self.engine = index, engine
        self.awaiting: dict[str, tuple[Request, RequestInfo]] = {}   # routed, no first token
        self.infos: dict[str, RequestInfo] = {}                      # routed, not finished
        self.finished: list[Request] = []
        self.events: list = []                  # KV events of quiet steps, not delivered yet
        self.busy = False                       # a step end is on the clock
        self.view = ReplicaView(kv_capacity=engine.config.kv_capacity)
        self.unprefilled = self.budget = 0      # prompt tokens / output budgets held
        self.link = None                        # a prefill worker's KV link (router/disagg.py)

    def snapshot(self) -> None:
        e = self.engine
        held = len(self.infos)
        running = e.sched.num_admitted
        self.view = ReplicaView(held - running, running, self.unprefilled, self.budget,
                                e.pool.used(), e.config.kv_capacity,
                                0.0 if self.link is None else self.link.free_at)

    def routed(self, req: Request, info: RequestInfo) -> None:
        self.engine.add_request(req)
        self.awaiting[req.rid] = (req, info)
        self.infos[req.rid] = info
        self.unprefilled += req.prompt_len
        self.budget += req.max_new_tokens
        v = self.view
        self.view = v._replace(waiting=v.waiting + 1, prefill_tokens=self.unprefilled,
                               decode_tokens=self.budget)


def merged_report(name: str, engines: Sequence[Engine], records: list[RequestRecord],
                  makespan: float) -> EngineReport:
    """Engines' work as one run over `records`: their evictions, counters, steps and KV."""
    counters = [e.sched.counters for e in engines]
    return EngineReport(name, records, sum(e.manager.evicted_tokens for e in engines),
                        sum(c.retractions for c in counters), sum(c.held_back for c in counters),
                        sum(c.lpm_fallbacks for c in counters), sum(e.steps for e in engines),
                        makespan, sum(e.config.kv_capacity for e in engines), {})


def request_info(req: Request, session: str | None) -> RequestInfo:
    return RequestInfo(req.rid, req.tokens, req.namespace, req.routing_key or session,
                       req.arrival, req.max_new_tokens, req.prompt_key)


class Cluster:
    def __init__(self, config: ClusterConfig, router: Router, cost: StepCost):
        if router.n != config.replicas:
            raise ValueError(f"the router routes over {router.n} replicas, the cluster has "
                             f"{config.replicas}")
        self.config, self.router = config, router
        cfg = config.engine
        if router.uses_events:
            cfg = replace(cfg, cache=config.event_cache())
        extra = (lambda: {"clock": logical_clock()}) if cfg.cache.kind == "radix" else dict
        self.replicas = [Replica(i, Engine(cfg, cfg.cache.build(**extra()), SimExecutor(cost),
                                           on_finish=None))
                         for i in range(config.replicas)]
        for rep in self.replicas:
            rep.engine.on_finish = rep.finished.append
        self._clock: list[tuple[float, int, int, int]] = []   # (time, kind, replica, 0)
        self._horizon = math.inf                  # the next arrival's time
        self._due = ArrivalQueue(())              # the arrivals to come
        self._pos: dict[int, int] = {}            # id(request) -> its trace position

    def _deliver(self, rep: Replica) -> None:
        """The router hears what the replica's last step did."""
        r, router = rep.index, self.router
        if router.uses_events:
            events = _runs(rep.engine.cache)
            if rep.events:
                events, rep.events = rep.events + events, []
            if events:
                router.on_events(r, events)
        if rep.awaiting:
            running = rep.engine.sched.running
            pool = rep.awaiting.values() if len(rep.awaiting) <= len(running) + 1 else \
                [rep.awaiting[q.rid] for q in running if q.rid in rep.awaiting]
            for req, info in [p for p in pool if p[0].first_token is not None]:
                del rep.awaiting[req.rid]
                rep.unprefilled -= req.prompt_len
                router.on_ttft(r, info, req.first_token - req.arrival)
                router.on_first_token(r, info)
        chained = self._due.chain is not None
        for req in rep.finished:
            if chained and self._due.finished(self._pos[id(req)], req.finish_time) is not None:
                self._horizon = self._due.next_time()     # a session's next turn, released
            if req.rid in rep.awaiting:               # finished in the step of its prefill
                del rep.awaiting[req.rid]
                rep.unprefilled -= req.prompt_len
                router.on_ttft(r, rep.infos[req.rid], req.first_token - req.arrival)
            rep.budget -= req.max_new_tokens
            router.on_finish(r, rep.infos.pop(req.rid))
        rep.finished.clear()
        rep.snapshot()

    def _step(self, rep: Replica, now: float) -> None:
        e = rep.engine
        e.now = max(e.now, now)
        horizon = min(self._horizon, now + self._due.floor())
        heard = self.router.uses_events
        while e.has_work():
            if e.decode_run(horizon, evict_events=heard):     # quiet steps, ending by the horizon
                if heard:
                    rep.events.extend(_runs(e.cache))
                rep.snapshot()
            if not e.step():
                break
            if e.now > horizon or e.last_prefill or rep.finished:
                heapq.heappush(self._clock, (e.now, _STEP_END, rep.index, 0))
                rep.busy = True
                return
            if heard:                             # told before the next route (_tell)
                rep.events.extend(_runs(e.cache))
            rep.snapshot()                        # a quiet step's whole delivery
        rep.busy = False

    def _tell(self) -> None:
        """The router hears the KV events of the quiet steps run since it last heard them:
        each ended by the arrival being routed (a step crossing it keeps its events in the
        cache, for its step end)."""
        for rep in self.replicas:
            if rep.events:
                events, rep.events = rep.events, []
                self.router.on_events(rep.index, events)

    def run(self, requests: Sequence[tuple[Request, str | None]],
            progress: Callable[[int], object] | None = None,
            arrivals: SessionArrivals | None = None) -> list[Request]:
        """Serve (request, session) pairs, in trace order: each at its arrival, or with
        `arrivals` each later turn of a session a think time after its previous turn finished
        (its arrival set to that); returns every request, finished."""
        for req, _ in requests:
            self.replicas[0].engine.check_fits(req)
        chain = None if arrivals is None else SessionChain([s for _, s in requests], arrivals)
        self._due = ArrivalQueue([q.arrival for q, _ in requests], chain)
        self._pos = {id(q): i for i, (q, _) in enumerate(requests)}
        self._horizon = self._due.next_time()
        while True:
            t_arr = self._due.next_time()
            if self._clock and self._clock[0][0] <= t_arr:
                done = self.step_end()
                if progress is not None and done:
                    progress(done)
            elif self._due:
                i, t = self._due.pop()
                req, session = requests[i]
                req.arrival = t
                self._horizon = self._due.next_time()
                self.route(req, session)
            else:
                break
        stuck = [q for q, _ in requests if q.status is not Status.FINISHED]
        if stuck:
            raise RuntimeError(f"{len(stuck)} requests never finished, e.g. {stuck[0]!r}")
        return [q for q, _ in requests]

    # ---- one event at a time (run, and a disaggregated cluster's two pools) --------------------
    def next_step_end(self) -> float:
        """When the earliest step end on the clock is due (inf: none is)."""
        return self._clock[0][0] if self._clock else math.inf

    def step_end(self) -> int:
        """The earliest step end: the router hears it, the replica steps on; returns the
        requests that finished there."""
        t, _, r, _ = heapq.heappop(self._clock)
        rep = self.replicas[r]
        done = len(rep.finished)
        self._deliver(rep)
        self._step(rep, t)
        return done

    def route(self, req: Request, session: str | None) -> int:
        """Route `req`, arrived now (its arrival), and send it to that replica; its index.
        Quiet steps started here run up to `horizon`, the next moment a view may be read."""
        info = request_info(req, session)
        if self.router.uses_events:
            self._tell()
        views = [rep.view for rep in self.replicas]
        r = self.router.route(info, views)
        if not isinstance(r, int) or not 0 <= r < len(self.replicas):
            raise ValueError(f"router {self.router.name!r} returned {r!r}, not a replica index "
                             f"in [0, {len(self.replicas)})")
        rep = self.replicas[r]
        rep.routed(req, info)
        self.router.on_route(r, info)
        if not rep.busy:
            self._step(rep, req.arrival)
        return r

    @property
    def horizon(self) -> float:
        return self._horizon

    @horizon.setter
    def horizon(self, t: float) -> None:
        self._horizon = t

    def report(self, name: str) -> EngineReport:
        """The replicas' requests as one run."""
        engines = [rep.engine for rep in self.replicas]
        recs = [RequestRecord.of(q) for e in engines for q in e.finished]
        first = min((q.arrival for e in engines for q in e.requests), default=0.0)
        last = max((q.finish_time for e in engines for q in e.finished), default=first)
        return merged_report(name, engines, recs, last - first)

    def check(self) -> None:
        """Every replica's cache, pool and lock invariants."""
        for rep in self.replicas:
            rep.engine.manager.check()


def run_cluster(workload, config: ClusterConfig, router: str, cost: StepCost,
                options=None, progress: Callable[[int], object] | None = None,
                check: bool = False, arrivals: SessionArrivals | None = None) -> ClusterResult:
    """One router's run of the workload on a fresh cluster (`arrivals`: session arrivals)."""
    rt = ROUTERS.get(router)(config.context(cost), options)
    cluster = Cluster(config, rt, cost)
    with collector_paused():
        reqs = [(request_from_trace(tr, i), tr.session) for i, tr in enumerate(workload)]
        cluster.run(reqs, progress, arrivals)
    if check:
        cluster.check()
    res = cluster_result(router, cluster.report(router),
                         [rep.engine.report() for rep in cluster.replicas])
    res.details["itl_p50"], res.details["itl_p99"] = itl_percentiles(
        [rep.engine.timeline for rep in cluster.replicas])
    return res
