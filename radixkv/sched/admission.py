"""PrefillAdder: admit waiting requests into one prefill batch within token and memory budgets.

Memory budget = free slots + evictable tokens − tokens reserved for the remaining decode of
running requests (remaining × new_token_ratio); a request also leaves its own reserve, unless
it runs alone (see `own_reserve`). The matched prefix is locked before slots are
allocated, and the budget is checked again after locking: locking moves the prefix's tokens
from evictable to protected, so a check made before the lock can over-commit.
"""
from __future__ import annotations

import enum
import math

import numpy as np

from radixkv.cache.base import PrefixCache
from radixkv.cache.pool import SlotPool, round_up
from radixkv.sched.request import Request


class AddResult(enum.Enum):
    ADDED = "added"            # the whole fill is in this batch
    CHUNKED = "chunked"        # part of it: continue next round
    NO_TOKENS = "no_tokens"    # token budget spent: stop adding
    NO_MEMORY = "no_memory"    # memory budget spent: stop adding


class Counters:
    """Scheduler-wide tallies shared by admission, decode and retraction."""
    def __init__(self):
        self.evicted_tokens = 0
        self.retractions = 0
        self.held_back = 0
        self.lpm_fallbacks = 0


def alloc_slots(pool: SlotPool, cache: PrefixCache, n: int, counters: Counters | None = None) -> np.ndarray:
    """Allocate n slots (whole pages), evicting from the cache as needed."""
    short = -(-n // pool.page_size) * pool.page_size - pool.available()
    if short > 0:
        freed = cache.evict(short)
        if counters is not None:
            counters.evicted_tokens += len(freed)
        pool.free(freed)
    return pool.alloc(n)


class PrefillAdder:
    def __init__(self, cache: PrefixCache, pool: SlotPool, token_budget: int, chunk: bool,
                 reserved: int, new_token_ratio: float, counters: Counters):
        self.cache, self.pool, self.counters = cache, pool, counters
        self.rem_tokens, self.chunk = token_budget, chunk
        self.reserved, self.ratio = reserved, new_token_ratio
        self.admitted: list[tuple[Request, int]] = []      # (request, tokens computed this step)

    def mem_budget(self) -> int:
        return self.pool.available() + self.cache.evictable_size() - self.reserved

    def decode_reserve(self, req: Request) -> int:
        return math.ceil(req.remaining_decode * self.ratio)

    def own_reserve(self, req: Request) -> int:
        """The reserve `req` must leave for its own decode; 0 when it runs alone (nothing
        reserved for others, nothing admitted before it): Engine.add_request checked that it
        fits kv_capacity, and counting its reserve on top of its page-rounded fill could
        refuse it forever (a lone request must always make progress)."""
        return self.decode_reserve(req) if (self.admitted or self.reserved) else 0

    def add(self, req: Request) -> AddResult:
        """Match, lock, check, allocate. On NO_* the request is unchanged and nothing is
        locked or allocated (the match may have refreshed access times or split an edge)."""
        if self.rem_tokens <= 0:
            return AddResult.NO_TOKENS
        ps = self.pool.page_size
        # budget check on a pure read: a request refused for memory must not refresh access
        # times or bump hit counts (LFU/SLRU would protect prefixes nobody was served)
        m = self.cache.match_prefix(req.match_key(), split=False)
        extend = req.fill_len - m.prefix_len
        n = extend
        if extend > self.rem_tokens:
            if self.chunk:
                n = self.rem_tokens - self.rem_tokens % ps
                if n <= 0:
                    return AddResult.NO_TOKENS
            elif self.admitted:
                return AddResult.NO_TOKENS         # a long prompt alone may exceed the budget
        need = round_up(m.prefix_len + n, ps) - m.prefix_len + self.own_reserve(req)
        if need > self.mem_budget():
            return AddResult.NO_MEMORY
        m = self.cache.match_prefix(req.match_key(), split=True)   # same length; now lockable
        self.cache.inc_lock_ref(m.last_node)
        if need > self.mem_budget():               # the lock may have shrunk evictable
            self.cache.dec_lock_ref(m.last_node)
            return AddResult.NO_MEMORY
        new = alloc_slots(self.pool, self.cache, round_up(m.prefix_len + n, ps) - m.prefix_len,
                          self.counters)
        req.slots = np.concatenate([m.slots, new])
        req.cached_len, req.last_node, req.num_computed = m.prefix_len, m.last_node, m.prefix_len
        self.rem_tokens -= n
        self.reserved += self.decode_reserve(req)
        self.admitted.append((req, n))
        return AddResult.ADDED if n == extend else AddResult.CHUNKED

    def add_chunk(self, req: Request) -> AddResult:
        """Continue a chunked request: its computed part is cached and locked already."""
        ps = self.pool.page_size
        extend = req.fill_len - req.num_computed
        n = extend if extend <= self.rem_tokens else self.rem_tokens - self.rem_tokens % ps
        if n <= 0:
            return AddResult.NO_TOKENS
        have = len(req.slots) - req.num_computed           # spare slots of the last page
        want = max(round_up(req.num_computed + n, ps) - req.num_computed - have, 0)
        if want + self.own_reserve(req) > self.mem_budget():
            return AddResult.NO_MEMORY
        req.extend_slots(alloc_slots(self.pool, self.cache, want, self.counters))
        self.rem_tokens -= n
        self.reserved += self.decode_reserve(req)
        self.admitted.append((req, n))
        return AddResult.ADDED if n == extend else AddResult.CHUNKED
