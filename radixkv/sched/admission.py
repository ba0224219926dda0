"""PrefillAdder: admit waiting requests into one prefill batch within token and memory budgets.

Memory budget = free slots + evictable tokens − tokens reserved for the remaining decode of
running requests (remaining × new_token_ratio); a request also leaves its own reserve, unless
it runs alone (see `own_reserve`). The CacheManager does the matching, locking and allocating
(all or nothing); this module only decides how much each request may take.
"""
from __future__ import annotations

import enum
import math

from radixkv.cache.manager import CacheManager
from radixkv.cache.pool import round_up
from radixkv.sched.request import Request


class AddResult(enum.Enum):
    ADDED = "added"            # the whole fill is in this batch
    CHUNKED = "chunked"        # part of it: continue next round
    NO_TOKENS = "no_tokens"    # token budget spent: stop adding
    NO_MEMORY = "no_memory"    # memory budget spent: stop adding


class Counters:
    """Scheduler-wide tallies shared by admission, decode and retraction."""
    def __init__(self):
        self.retractions = 0
        self.held_back = 0
        self.lpm_fallbacks = 0
        self.overdue = 0           # request-rounds admitted ahead of lpm for waiting too long


class PrefillAdder:
    def __init__(self, mgr: CacheManager, token_budget: int, chunk: bool, reserved: int,
                 new_token_ratio: float):
        self.mgr = mgr
        self.rem_tokens, self.chunk = token_budget, chunk
        self.reserved, self.ratio = reserved, new_token_ratio
        self.admitted: list[tuple[Request, int]] = []      # (request, tokens computed this step)

    def mem_budget(self) -> int:
        return self.mgr.budget() - self.reserved

    def decode_reserve(self, req: Request) -> int:
        return math.ceil(req.remaining_decode * self.ratio)

    def own_reserve(self, req: Request) -> int:
        """The reserve `req` must leave for its own decode; 0 when it runs alone (nothing
        reserved for others, nothing admitted before it): Engine.add_request checked that it
        fits kv_capacity, and counting its reserve on top of its page-rounded fill could
        refuse it forever (a lone request must always make progress)."""
        return self.decode_reserve(req) if (self.admitted or self.reserved) else 0

    def _chunk_of(self, extend: int) -> int:
        """New tokens this step may take of `extend`: all, or a page-aligned chunk (0: none)."""
        if extend <= self.rem_tokens:
            return extend
        if self.chunk:
            return self.rem_tokens - self.rem_tokens % self.mgr.page_size
        return 0 if self.admitted else extend      # a long prompt alone may exceed the budget

    def add(self, req: Request) -> AddResult:
        """Size the fill from the memoised pure-read match, then let the manager admit it.
        On NO_* the request is unchanged and nothing is locked or allocated."""
        if self.rem_tokens <= 0:
            return AddResult.NO_TOKENS
        key = req.match_key()
        prefix, _ = self.mgr.cached_prefix(req, key)
        extend = req.fill_len - prefix
        n = self._chunk_of(extend)
        if n <= 0:
            return AddResult.NO_TOKENS
        got = self.mgr.admit(req, key, prefix + n, self.reserved + self.own_reserve(req))
        if got is None:
            return AddResult.NO_MEMORY
        req.num_computed, n = got, prefix + n - got
        self.rem_tokens -= n
        self.reserved += self.decode_reserve(req)
        self.admitted.append((req, n))
        return AddResult.ADDED if got + n == req.fill_len else AddResult.CHUNKED

    def add_chunk(self, req: Request) -> AddResult:
        """Continue a chunked request: its computed part is cached and locked already."""
        ps = self.mgr.page_size
        n = self._chunk_of(req.fill_len - req.num_computed) if self.rem_tokens > 0 else 0
        if n <= 0:
            return AddResult.NO_TOKENS
        have = len(req.slots) - req.num_computed           # spare slots of the last page
        want = max(round_up(req.num_computed + n, ps) - req.num_computed - have, 0)
        if want + self.own_reserve(req) > self.mem_budget():
            return AddResult.NO_MEMORY
        self.mgr.grow([req], want)
        self.rem_tokens -= n
        self.reserved += self.decode_reserve(req)
        self.admitted.append((req, n))
        return AddResult.ADDED if req.num_computed + n == req.fill_len else AddResult.CHUNKED
