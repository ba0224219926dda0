"""The disaggregated cluster simulator: a prefill pool and a decode pool, each replica the
existing engine, on one discrete-event clock.

A request is routed to a prefill worker by any router (the prefill workers hold the prefix
cache, so a cache-aware router matters here); the worker computes its prompt and first token
(a request of one output token: its pages stay in that worker's cache). Its KV then goes over
the worker's link to the decode pool (radixkv.sim.kv_links: latency + bytes / bandwidth, each
tensor-parallel rank over its own link; one worker's transfers queue behind each other, and
overlap both pools' steps, as NIXL / Mooncake transfer engines run beside the forward passes).
When it lands, the decode router (by load) picks a decode worker, which admits it into its
running batch at a decode's price (radixkv.sim.decode_worker) and produces its output there.

The client sees its first token from the decode worker: TTFT = prefill queue and compute, the
transfer, and the decode worker's first step; E2E ends with the decode. Per pool the result
also reports the prefill workers' own time to first token, the transfers, and the decode
workers' queue and inter-token latency.

Event order at equal times: prefill step ends, decode step ends, transfers landing, arrivals.
Each pool is a router.cluster.Cluster driven one event at a time; a decode worker runs quiet
steps only up to the earliest moment a transfer could land (the decode router reads its view
then): the next known landing, or the next prefill step end or arrival plus the link's latency.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from radixkv.config import EngineConfig
from radixkv.engine.engine import request_from_trace
from radixkv.engine.metrics import EngineReport, RequestRecord, itl_percentiles
from radixkv.offline.replay import collector_paused
from radixkv.router import ROUTERS
from radixkv.router.base import StepCost
from radixkv.offline.cluster.simulator import Cluster, ClusterConfig, merged_report
from radixkv.offline.cluster.results import ClusterResult, cluster_result
from radixkv.sched.request import Request, Status
from radixkv.sim.decode_worker import DecodeWorkerCost
from radixkv.sim.kv_links import DEFAULT_KV_LINK, KV_LINKS, LinkQueue
from radixkv.argcheck import int_at_least, positive_int
from radixkv.workloads.sessions import ArrivalQueue

DECODE_ROUTER = "least-load"


@dataclass(frozen=True)
class DisaggConfig:
    """`prefill_replicas` workers of `prefill` and `decode_replicas` of `decode` (each engine
    config for one worker: its KV pool, cache and scheduler), joined by the KV link `link`."""
    prefill: EngineConfig
    decode: EngineConfig
    prefill_replicas: int
    decode_replicas: int
    link: str = DEFAULT_KV_LINK
    decode_router: str = DECODE_ROUTER
    seed: int = 0

    def __post_init__(self):
        positive_int(self.prefill_replicas, "prefill_replicas")
        positive_int(self.decode_replicas, "decode_replicas")
        int_at_least(self.seed, "seed", 0)
        KV_LINKS.get(self.link)
        ROUTERS.get(self.decode_router)
        if self.prefill.cache.page_size != self.decode.cache.page_size:
            raise ValueError(f"prefill pages of {self.prefill.cache.page_size} tokens and decode "
                             f"pages of {self.decode.cache.page_size} differ")

    @property
    def replicas(self) -> int:
        return self.prefill_replicas + self.decode_replicas

    @property
    def engine(self) -> EngineConfig:
        """The prefill workers' engine (the one that holds the prefix cache)."""
        return self.prefill

    def prefill_pool(self) -> ClusterConfig:
        return ClusterConfig(self.prefill, self.prefill_replicas, self.seed)

    def decode_pool(self) -> ClusterConfig:
        return ClusterConfig(self.decode, self.decode_replicas, self.seed)


def decode_engine(cfg: EngineConfig) -> EngineConfig:
    """A decode worker's engine over the same pool and cache: every prompt it admits joins the
    running batch in one step (no chunking, mixed with the decodes, no in-batch hold-back,
    first come first served)."""
    sched = replace(cfg.sched, policy="fcfs", chunked_prefill_size=0, mixed_decode=True,
                    shared_token_budget=False, dedup=False,
                    max_prefill_tokens=max(cfg.sched.max_prefill_tokens, cfg.kv_capacity))
    return replace(cfg, sched=sched, name=cfg.name and f"{cfg.name} decode")


class Twin:
    """One request's two halves and its transfer."""
    __slots__ = ("pre", "dec", "session", "start", "landed")

    def __init__(self, pre: Request, dec: Request, session: str | None):
        self.pre, self.dec, self.session = pre, dec, session
        self.start = self.landed = math.nan

    def record(self) -> RequestRecord:
        p, d = self.pre, self.dec
        out = len(d.output)
        return RequestRecord(p.rid, p.arrival, p.first_admit - p.arrival,
                             d.first_token - p.arrival,
                             (d.finish_time - d.first_token) / max(out - 1, 1),
                             d.finish_time - p.arrival, p.prompt_len, out, p.cached_tokens,
                             p.prefill_tokens, p.recomputed_tokens,
                             p.retractions + d.retractions, p.first_admit)


class DisaggCluster:
    def __init__(self, config: DisaggConfig, router, cost: StepCost, decode_router):
        self.config = config
        self.pre = Cluster(config.prefill_pool(), router, cost)
        self.dec = Cluster(config.decode_pool(), decode_router, DecodeWorkerCost(cost))
        link = KV_LINKS.get(config.link)
        self._latency = link.latency_s
        per_gpu = cost.model_spec.kv_bytes_per_token_per_gpu
        self.links = [LinkQueue(link, per_gpu) for _ in range(config.prefill_replicas)]
        for rep, q in zip(self.pre.replicas, self.links):
            rep.link = q
            rep.engine.on_finish = self._prefilled_on(rep)
        self._landing: list[tuple[float, int, Twin]] = []     # (lands, trace position, twin)
        self._twins: dict[str, Twin] = {}

    def _prefilled_on(self, rep) -> Callable[[Request], None]:
        q, finished = self.links[rep.index], rep.finished

        def prefilled(req: Request) -> None:
            finished.append(req)
            twin = self._twins[req.rid]
            twin.start, twin.landed = q.send(req.finish_time, req.prompt_len)
            heapq.heappush(self._landing, (twin.landed, req.index, twin))
        return prefilled

    def _decode_horizon(self, due: ArrivalQueue) -> float:
        nxt = self._landing[0][0] if self._landing else math.inf
        return min(nxt, min(self.pre.next_step_end(), due.next_time()) + self._latency)

    def run(self, twins: Sequence[Twin]) -> list[Twin]:
        """Serve every twin from its prefill request's arrival; returns them, finished."""
        for tw in twins:
            self.pre.replicas[0].engine.check_fits(tw.pre)
            self.dec.replicas[0].engine.check_fits(tw.dec)
        self._twins = {tw.pre.rid: tw for tw in twins}
        if len(self._twins) != len(twins):
            raise ValueError("two requests share an id")
        due = ArrivalQueue([tw.pre.arrival for tw in twins])
        pre, dec = self.pre, self.dec
        while True:
            t_pre, t_dec = pre.next_step_end(), dec.next_step_end()
            t_land = self._landing[0][0] if self._landing else math.inf
            t_arr = due.next_time()
            t = min(t_pre, t_dec, t_land, t_arr)
            if t == math.inf:
                break
            if t_pre == t:
                pre.horizon = t_arr
                pre.step_end()
            elif t_dec == t:
                dec.horizon = self._decode_horizon(due)
                dec.step_end()
            elif t_land == t:
                _, _, tw = heapq.heappop(self._landing)
                tw.dec.arrival = t
                dec.horizon = self._decode_horizon(due)
                dec.route(tw.dec, tw.session)
            else:
                i, ta = due.pop()
                tw = twins[i]
                tw.pre.arrival = ta
                pre.horizon = due.next_time()
                pre.route(tw.pre, tw.session)
        stuck = [tw.pre for tw in twins if tw.dec.status is not Status.FINISHED]
        if stuck:
            raise RuntimeError(f"{len(stuck)} requests never finished, e.g. {stuck[0]!r}")
        return list(twins)

    def report(self, name: str, twins: Sequence[Twin]) -> EngineReport:
        """The requests as the clients saw them, as one run over both pools."""
        engines = [rep.engine for c in (self.pre, self.dec) for rep in c.replicas]
        recs = [tw.record() for tw in twins]
        first = min((r.arrival for r in recs), default=0.0)
        last = max((tw.dec.finish_time for tw in twins), default=first)
        return merged_report(name, engines, recs, last - first)

    def pools(self, twins: Sequence[Twin]) -> dict:
        """Each pool's own figures and the transfers'."""
        def pct(xs, q):
            return float(np.percentile(xs, q)) if len(xs) else None
        pre_ttft = [tw.pre.first_token - tw.pre.arrival for tw in twins]
        xfer = [tw.landed - tw.pre.finish_time for tw in twins]
        wait = [tw.start - tw.pre.finish_time for tw in twins]
        dec_first = [tw.dec.first_token - tw.landed for tw in twins]
        itl50, itl99 = itl_percentiles([rep.engine.timeline for rep in self.dec.replicas])
        span = max((tw.dec.finish_time for tw in twins), default=0.0) - \
            min((tw.pre.arrival for tw in twins), default=0.0)
        return {
            "prefill": {"replicas": self.config.prefill_replicas,
                        "ttft_p50": pct(pre_ttft, 50), "ttft_p99": pct(pre_ttft, 99)},
            "transfer": {"link": self.config.link,
                         "tokens": sum(q.sent_tokens for q in self.links),
                         "seconds_p50": pct(xfer, 50), "seconds_p99": pct(xfer, 99),
                         "link_wait_p99": pct(wait, 99),
                         "link_busy_share": (sum(q.busy_s for q in self.links)
                                             / (len(self.links) * span)) if span > 0 else 0.0},
            "decode": {"replicas": self.config.decode_replicas,
                       "first_token_p50": pct(dec_first, 50),
                       "first_token_p99": pct(dec_first, 99),
                       "itl_p50": itl50, "itl_p99": itl99,
                       "cached_tokens": sum(tw.dec.cached_tokens for tw in twins)},
        }

    def check(self) -> None:
        self.pre.check()
        self.dec.check()


def twins_of(workload) -> list[Twin]:
    """Each trace request as a prefill request (its prompt and one token) and a decode request
    (its prompt, arriving computed, and its whole output)."""
    return [Twin(request_from_trace(tr, i, max_new_tokens=1, force=False),
                 request_from_trace(tr, i), tr.session) for i, tr in enumerate(workload)]


def run_disagg(workload, config: DisaggConfig, router: str, cost: StepCost, options=None,
               check: bool = False) -> ClusterResult:
    """One prefill router's run of the workload on a fresh disaggregated cluster."""
    rt = ROUTERS.get(router)(config.prefill_pool().context(cost), options)
    drt = ROUTERS.get(config.decode_router)(config.decode_pool().context(DecodeWorkerCost(cost)))
    cluster = DisaggCluster(config, rt, cost, drt)
    with collector_paused():
        twins = cluster.run(twins_of(workload))
    if check:
        cluster.check()
    res = cluster_result(router, cluster.report(router, twins),
                         [rep.engine.report() for rep in cluster.pre.replicas])
    pools = res.details["pools"] = cluster.pools(twins)
    res.details["itl_p50"], res.details["itl_p99"] = (pools["decode"]["itl_p50"],
                                                      pools["decode"]["itl_p99"])
    return res
