"""The engine loop: arrivals -> Scheduler.schedule -> executor.run -> Scheduler.process.

Time is the executor's: a SimExecutor's step durations advance a virtual clock, a real
executor's are measured. Nothing here knows which executor runs.
"""
from __future__ import annotations

import heapq
import itertools
import math
from typing import Callable

from radixkv.cache.base import PrefixCache
from radixkv.cache.manager import CacheManager
from radixkv.cache.pool import SlotPool, round_up
from radixkv.config import EngineConfig
from radixkv.engine.executor import Executor
from radixkv.engine.metrics import EngineReport, RequestRecord
from radixkv.sched.request import Request, SessionTurns, Status
from radixkv.sched.scheduler import Scheduler


def request_from_trace(tr, index: int, sampling=None, max_new_tokens: int | None = None,
                       force: bool = True, stop_ids=()) -> Request:
    """A scheduler Request from a workload TraceRequest: scripted when it has an output (or
    records none at all); otherwise the executor produces `output_len` tokens (a simulated
    GPU: filler ids, as replay uses)."""
    forced = tr.output if (force and tr.output is not None) else None
    if forced is None and force and tr.output_len == 0 and max_new_tokens is None:
        forced = ()
    return Request(tr.id, tr.prompt, max_new_tokens or max(tr.output_len, 1), arrival=tr.arrival,
                   forced_output=forced, extra_key=tr.extra_key, cache_salt=tr.cache_salt,
                   priority=tr.priority, routing_key=tr.routing_key, sampling=sampling,
                   stop_ids=stop_ids, index=index, pin_ttl=tr.pin_ttl, session=tr.session)


class Engine:
    def __init__(self, config: EngineConfig, cache: PrefixCache, executor: Executor,
                 on_admit: Callable[[Request], object] | None = None,
                 on_finish: Callable[[Request], object] | None = None):
        """`on_finish(req)` runs as each request finishes, with `now` its finish time; it may
        add requests (a closed-loop client sends its next one), which arrive no earlier than
        `now` and so are queued at the next step."""
        self.config, self.cache, self.executor = config, cache, executor
        self.pool = SlotPool(config.kv_capacity, cache.page_size)
        self.manager = CacheManager(cache, self.pool)
        self.sched = Scheduler(config.sched, self.manager, on_admit=on_admit)
        self.on_finish = on_finish
        self.now = 0.0
        self.requests: list[Request] = []
        self.finished: list[Request] = []
        self._arrivals: list[tuple[float, int, Request]] = []
        self._order = itertools.count()           # arrival ties in submission order, unique
        self._turns = SessionTurns()              # a session's arrivals, numbered
        self.steps = 0
        self.last_prefill = False                 # the last step computed prefill segments
        self.timeline: dict[str, list] = {"t": [], "waiting": [], "running": [], "kv_used": []}

    def check_fits(self, req: Request) -> None:
        """Refuse a request the whole pool could not hold."""
        need = round_up(req.prompt_len + req.max_new_tokens, self.pool.page_size)
        if need > self.config.kv_capacity:
            raise ValueError(f"request {req.rid!r} needs {need} KV slots (prompt {req.prompt_len} "
                             f"+ up to {req.max_new_tokens} new) but kv_capacity is "
                             f"{self.config.kv_capacity}")

    def add_request(self, req: Request) -> Request:
        self.check_fits(req)
        heapq.heappush(self._arrivals, (req.arrival, next(self._order), req))
        self.requests.append(req)
        return req

    def abort(self, req: Request) -> bool:
        """Take out a request that has not finished: not arrived yet, waiting or running. Its
        slots and lock are released now. False when it finished (or was aborted) already."""
        pending = [a for a in self._arrivals if a[2] is not req]
        if len(pending) != len(self._arrivals):
            self._arrivals = pending
            heapq.heapify(self._arrivals)
            req.status = Status.ABORTED
        elif not self.sched.abort(req):
            return False
        self.executor.release(req.rid)
        return True

    def forget_finished(self) -> None:
        """Drop the history a long-running server does not need: finished and aborted requests
        and the timeline (report() then covers only what comes after)."""
        self.finished.clear()
        self.requests = [r for r in self.requests
                         if r.status not in (Status.FINISHED, Status.ABORTED)]
        for series in self.timeline.values():
            series.clear()

    def has_work(self) -> bool:
        return bool(self._arrivals) or self.sched.has_work()

    def step(self) -> bool:
        """One scheduling round and executor run; False when there is nothing left to do."""
        while self._arrivals and self._arrivals[0][0] <= self.now:
            req = heapq.heappop(self._arrivals)[2]
            if req.turn is None:
                req.turn = self._turns.next(req.session)
            self.sched.add(req)
        plan = self.sched.schedule(self.now)
        if plan is None:
            if not self._arrivals:
                return False                      # idle, or stuck: nothing can ever be scheduled
            self.now = max(self.now, self._arrivals[0][0])   # idle until the next arrival
            self.last_prefill = False
            return True
        self.last_prefill = bool(plan.extends)
        result = self.executor.run(plan)
        self.now += result.duration
        for req in self.sched.process(plan, result, self.now):
            self.finished.append(req)
            self.executor.release(req.rid)
            if self.on_finish is not None:
                self.on_finish(req)
        self.steps += 1
        tl = self.timeline
        tl["t"].append(self.now)
        tl["waiting"].append(len(self.sched.waiting))
        tl["running"].append(len(self.sched.running))
        tl["kv_used"].append(self.pool.used())
        if self.config.check_invariants:
            self.check_invariants()
        return True

    def decode_run(self, horizon: float = math.inf, max_steps: int | None = None,
                   evict_events: bool = False) -> int:
        """Run the decode-only steps that come next, each exactly as step() would run it,
        without building plans: while the scheduler can only decode its scripted running
        requests (Scheduler.decode_batch), no arrival is due, no request finishes, new pages
        come from free slots or evictions (no retraction) that emit no KV event unless
        `evict_events` (the caller takes the events from the cache after the run), each step
        ends by `horizon` and the executor prices steps without a plan (a simulated GPU).
        Returns the steps run (0: the next step is not one of these; step() runs it)."""
        if not self.executor.prices_decodes or self.config.check_invariants:
            return 0
        price, charge = self.executor.decode_step_time, self.executor.charge
        sched, pool, tick = self.sched, self.pool, self.manager.tick
        reqs = sched.decode_batch()
        if reqs is None:
            return 0
        b, ps = len(reqs), pool.page_size
        left = min(len(r.forced_output) - r.num_output for r in reqs)   # steps before a finish
        if max_steps is not None:
            left = min(left, max_steps - self.steps)
        done = [r.num_computed for r in reqs]     # at the run's start; step j computes done + j
        ctx_sum, ctx_max = sum(done), max(done)
        # the step at which each request fills its slots and needs a page (by position in reqs)
        wake: dict[int, list[int]] = {}
        for i, r in enumerate(reqs):
            wake.setdefault(max(r.num_slots - done[i], 0), []).append(i)
        due = self._arrivals[0][0] if self._arrivals else math.inf
        quiet_evict = evict_events or self.cache.events() is None   # heard later, or never
        now, used, times, kv, k = self.now, pool.used(), [], [], 0
        while k < left and due > now:
            dt = price(b, ctx_sum, ctx_max)
            if now + dt > horizon:
                break
            if k in wake:
                needy = sorted(wake[k])
                need = len(needy) * ps
                if k:
                    tick(self.now)                # the pins as the step before left them
                if need > pool.available() and (not quiet_evict or need > self.manager.budget()):
                    break                         # a KV event, or a retraction: step() runs it
                tick(now)                         # an eviction may read the clock
                self.manager.grow([reqs[i] for i in needy], ps)
                for i in wake.pop(k):
                    wake.setdefault(max(reqs[i].num_slots - done[i], k + 1), []).append(i)
                used = pool.used()
            charge(dt)
            self.now = now                        # the clock the last step started at
            now += dt
            ctx_sum, ctx_max = ctx_sum + b, ctx_max + 1
            times.append(now)
            kv.append(used)
            k += 1
        if k:
            tick(self.now)                        # as each step ticks before it runs
            self.now = now
            sched.decode_steps(reqs, k)
            self.steps += k
            tl = self.timeline
            tl["t"] += times
            tl["waiting"] += [0] * k
            tl["running"] += [b] * k
            tl["kv_used"] += kv
            self.last_prefill = False
        return k

    def check_invariants(self) -> None:
        self.manager.check()

    def run_until_idle(self, progress: Callable[[int], object] | None = None,
                       max_steps: int | None = None) -> EngineReport:
        done = len(self.finished)
        while self.has_work():
            self.decode_run(max_steps=max_steps)
            if max_steps is not None and self.steps >= max_steps:
                break
            if not self.step():
                break
            if max_steps is not None and self.steps >= max_steps:
                break
            if progress is not None and len(self.finished) != done:
                progress(len(self.finished) - done)
                done = len(self.finished)
        stuck = [r for r in self.requests if r.status not in (Status.FINISHED, Status.ABORTED)]
        if stuck and max_steps is None:
            raise RuntimeError(f"{len(stuck)} requests never finished, e.g. {stuck[0]!r}")
        return self.report()

    def report(self) -> EngineReport:
        recs = [RequestRecord.of(r) for r in self.finished]
        c = self.sched.counters
        first = min((r.arrival for r in self.requests), default=0.0)
        last = max((r.finish_time for r in self.finished), default=first)
        return EngineReport(self.config.label, recs, self.manager.evicted_tokens, c.retractions, c.held_back,
                            c.lpm_fallbacks, self.steps, last - first, self.config.kv_capacity,
                            self.timeline)
