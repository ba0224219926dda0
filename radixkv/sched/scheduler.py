"""The scheduler: waiting queue -> prefill batches -> decode steps -> finished, with retraction.

One round (`schedule`) builds a BatchPlan: a chunked request in progress continues first, then
waiting requests are admitted in policy order (held back by in-batch dedup when a batch-mate
will prefill their prefix), and when no prefill is formed (or mixed_decode is on) every
running request decodes one token. `process` applies the executor's result: prompts enter the
cache after prefill, requests leave it at finish. Every slot, lock and insert goes through the
CacheManager: the scheduler decides who and how much, never which slots.
"""
from __future__ import annotations

import bisect
import logging
import math
from typing import Any, Callable

from radixkv.cache.manager import CacheManager
from radixkv.sched.admission import AddResult, Counters, PrefillAdder
from radixkv.sched.batch import BatchPlan, Segment, StepResult
from radixkv.sched.config import SchedulerConfig
from radixkv.sched.policy import QUEUE_ORDERS, RETRACT_ORDERS, InBatchDedup, OrderContext
from radixkv.sched.request import STOP, Request, Status

log = logging.getLogger(__name__)


_SCRIPT_STOP = frozenset({STOP})


def _arrival_order(r: Request) -> tuple:
    return (r.arrival, r.index)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, mgr: CacheManager,
                 on_admit: Callable[[Request], Any] | None = None):
        self.cfg, self.mgr = cfg, mgr
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.chunked: Request | None = None
        self.order = QUEUE_ORDERS.get(cfg.policy)
        self.victim_key = RETRACT_ORDERS.get(cfg.retract_policy)
        self.ctx = OrderContext(mgr, self.running, cfg.seed)
        self.counters = Counters()
        self.new_token_ratio = cfg.init_new_token_ratio
        self.on_admit = on_admit
        self._falling_back = False
        self._guarding = False                    # the last guard kept entries

    def add(self, req: Request) -> None:
        """Queue a request; `waiting` stays in arrival order, so fcfs needs no sort."""
        req.status = Status.WAITING
        bisect.insort(self.waiting, req, key=_arrival_order)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    @property
    def num_admitted(self) -> int:
        """Requests holding slots: decoding, plus the one whose chunked prefill is under way."""
        return len(self.running) + (self.chunked is not None)

    # ---- one round ----------------------------------------------------------------------------
    def schedule(self, now: float) -> BatchPlan | None:
        plan = BatchPlan()
        self.mgr.tick(now)
        # one queue order per round: admission walks it, and the guard ranks by it (with a
        # chunked prefill under way nothing is ordered yet: arrival order stands in)
        order = self._ordered_waiting(now) if self.waiting and self.chunked is None else None
        if self.cfg.queue_aware_eviction and (self.waiting or self._guarding):
            # with nothing waiting the guard keeps nothing: once cleared it stays so
            self._guarding = self.mgr.guard((r, r.match_key()) for r in (order or self.waiting)) > 0
        if self.waiting or self.chunked is not None:     # else nothing to admit: decode only
            self._schedule_prefill(plan, now, order)
        if self.running and (not plan.extends or self.cfg.mixed_decode):
            retractions = self.counters.retractions
            self._schedule_decode(plan)
            if not plan and self.counters.retractions != retractions:
                # decode retracted every running request and formed no step: the memory it
                # freed can take a prefill now (an empty plan would read as a stuck queue)
                self._schedule_prefill(plan, now)
        if not plan:
            return None
        plan.copies = self.mgr.take_copies()      # host-tier copies run before the forward
        return plan

    def _reserved(self) -> int:
        """Decode reserve of the running requests (a chunked request's own reserve is counted
        by PrefillAdder.add_chunk: counting it here too refused its next chunk forever when
        memory was tight)."""
        return sum(math.ceil(r.remaining_decode * self.new_token_ratio) for r in self.running)

    def _ordered_waiting(self, now: float = 0.0) -> list[Request]:
        cfg = self.cfg
        if cfg.policy in ("lpm", "dfs-weight") and cfg.lpm_max_wait > 0:
            # requests waiting longer than lpm_max_wait go first, fcfs among them
            late = [r for r in self.waiting if now - r.arrival > cfg.lpm_max_wait]
            if late:
                ids = set(map(id, late))
                rest = [r for r in self._cache_order() if id(r) not in ids]
                self.counters.overdue += len(late)
                return late + rest
        return self._cache_order()

    def _cache_order(self) -> list[Request]:
        cfg = self.cfg
        if (cfg.policy in ("lpm", "dfs-weight") and cfg.lpm_fallback_threshold
                and len(self.waiting) > cfg.lpm_fallback_threshold):
            self.counters.lpm_fallbacks += 1          # counted per round, logged per episode
            if not self._falling_back:
                log.warning("%d waiting > %d: %s falls back to fcfs until the queue shrinks",
                            len(self.waiting), cfg.lpm_fallback_threshold, cfg.policy)
            self._falling_back = True
            return self.waiting                   # kept in arrival order: fcfs
        self._falling_back = False
        return self.order(self.waiting, self.ctx)

    def _schedule_prefill(self, plan: BatchPlan, now: float,
                          order: list[Request] | None = None) -> None:
        cfg = self.cfg
        budget = cfg.prefill_budget
        if cfg.shared_token_budget and cfg.mixed_decode:
            budget = max(budget - len(self.running), 0)     # the decodes' tokens come first
        adder = PrefillAdder(self.mgr, budget, cfg.chunked_prefill_size > 0,
                             self._reserved(), self.new_token_ratio)
        if self.chunked is not None:
            req = self.chunked
            if adder.add_chunk(req) is AddResult.ADDED:
                self.chunked = None
        if self.waiting and self.chunked is None:
            room = cfg.max_running_requests - len(self.running)
            dedup = None                          # holding back only helps when prefixes can be shared
            if cfg.dedup and self.mgr.cache.shares_prefixes:
                dedup = InBatchDedup(cfg.dedup_check_threshold, cfg.dedup_hold_threshold)
            admitted: set[int] = set()
            for req in order if order is not None else self._ordered_waiting(now):
                if len(adder.admitted) >= room:
                    break
                if dedup is not None and dedup.should_hold(req, self.ctx.prefix(req)[0]):
                    self.counters.held_back += 1
                    continue
                res = adder.add(req)
                if res in (AddResult.NO_TOKENS, AddResult.NO_MEMORY):
                    break
                admitted.add(id(req))
                if dedup is not None:
                    dedup.admitted(req)
                self._on_first_admit(req, now)
                req.status = Status.PREFILL
                if res is AddResult.CHUNKED:
                    self.chunked = req
                    break
            if admitted:
                self.waiting = [r for r in self.waiting if id(r) not in admitted]
        for req, n in adder.admitted:
            s = req.num_computed
            plan.extends.append(Segment(req, s, req.tokens[s:s + n], req.slots[:s + n],
                                        sample=s + n == req.fill_len))

    def _on_first_admit(self, req: Request, now: float) -> None:
        if req.first_admit is None:
            req.first_admit = now
            req.cached_tokens = req.cached_len
            req.host_hit_tokens = req.host_loaded
        if self.on_admit is not None:
            self.on_admit(req)

    def _schedule_decode(self, plan: BatchPlan) -> None:
        ps = self.mgr.page_size
        while True:
            needy = [r for r in self.running if r.num_slots <= r.num_computed]
            if len(needy) * ps <= self.mgr.budget():
                break
            self.retract(max(self.running, key=self.victim_key))
        self.mgr.grow(needy, ps)                   # a new page for each request that filled one
        for r in self.running:
            n = r.num_computed
            plan.decodes.append(Segment(r, n, r.tokens[n:n + 1], r.head_slots(n + 1), sample=True))
        self.new_token_ratio = max(self.cfg.min_new_token_ratio,
                                   self.new_token_ratio - self.cfg.new_token_ratio_decay)

    # ---- runs of decode steps ---------------------------------------------------------------
    def decode_batch(self) -> list[Request] | None:
        """The running requests when the next rounds can only decode them, one token each,
        every one scripted with no stop id but the script's end, no host tier queuing copies:
        what Engine.decode_run steps without plans. None otherwise."""
        if self.waiting or self.chunked is not None or not self.running or self._guarding \
                or self.mgr.host is not None:
            return None
        for r in self.running:
            if r.forced_output is None or r.stop_ids != _SCRIPT_STOP:
                return None
        return self.running

    def decode_steps(self, reqs: list[Request], k: int) -> None:
        """`k` rounds of `decode_batch()` and their results, as schedule() and process() apply
        them, but for the pages (the caller grew each request as it filled one): the script's
        next k tokens for every request (none finishes: the caller checked), the ratio's decay
        once per round."""
        for r in reqs:
            assert r.forced_output is not None      # the caller checked: every one is forced
            r.num_computed += k
            at = len(r.tokens) - r.prompt_len
            r.tokens += r.forced_output[at:at + k]
        ratio, floor, decay = self.new_token_ratio, self.cfg.min_new_token_ratio, \
            self.cfg.new_token_ratio_decay
        for _ in range(k):
            ratio = max(floor, ratio - decay)
            if ratio == floor:                    # and there it stays
                break
        self.new_token_ratio = ratio

    # ---- retraction ---------------------------------------------------------------------------
    def retract(self, req: Request) -> None:
        """Release a running request's slots and send it back to waiting. With retract_insert
        its computed KV enters the cache first, so its re-admission can hit."""
        if req not in self.running:                # checked first: nothing released yet
            raise ValueError(f"only a running request can be retracted, not {req!r}")
        self.mgr.release(req, insert=self.cfg.retract_insert)
        req.num_computed = 0
        self.running.remove(req)
        req.status = Status.WAITING
        req.retractions += 1
        self.counters.retractions += 1
        self.new_token_ratio = self.cfg.init_new_token_ratio
        bisect.insort(self.waiting, req, key=_arrival_order)
        log.debug("retracted %r", req)

    # ---- abort --------------------------------------------------------------------------------
    def abort(self, req: Request) -> bool:
        """Take a request out wherever it is between rounds (waiting, the chunked prefill,
        running), giving back its slots and lock at once; its computed KV is not inserted.
        False, changing nothing, when the scheduler does not hold it (finished already)."""
        if self.chunked is req:
            self.mgr.release(req)
            self.chunked = None
        elif req.status is Status.RUNNING and req in self.running:
            self.mgr.release(req)
            self.running.remove(req)
        elif req.status is Status.WAITING and req in self.waiting:
            self.waiting.remove(req)             # a waiting request holds no slots
            self.mgr.forget(req)
        else:
            return False
        req.status = Status.ABORTED
        return True

    # ---- results ------------------------------------------------------------------------------
    def process(self, plan: BatchPlan, result: StepResult, now: float) -> list[Request]:
        """Apply one step's result; returns the requests that finished."""
        finished = []
        n_ext = len(plan.extends)
        for i, (seg, tok) in enumerate(zip(plan.segments, result.tokens, strict=True)):
            req = seg.req
            req.num_computed += seg.n
            if i < n_ext:
                req.prefill_tokens += seg.n
                if req.retractions:
                    req.recomputed_tokens += seg.n
            if not seg.sample:                    # a chunk: cache the computed part, keep the lock
                self.mgr.cache_req(req, finished=False)
                continue
            if req.first_token is None:
                req.first_token = now
            if req.accept(req.next_token(tok)):
                self._finish(req, now)
                finished.append(req)
            elif i < n_ext:                       # prefill complete: share the prompt, decode next
                self.mgr.cache_req(req, finished=False)
                req.status = Status.RUNNING
                self.running.append(req)
        return finished

    def _finish(self, req: Request, now: float) -> None:
        self.mgr.cache_req(req, finished=True)     # it also resets the request's cache share
        if req.status is Status.RUNNING:
            self.running.remove(req)
        req.status = Status.FINISHED
        req.finish_time = now
