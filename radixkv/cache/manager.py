"""CacheManager: one request lifecycle over a PrefixCache and its SlotPool.

The manager is the only code that allocates, inserts, frees and locks on a request's behalf:
the scheduler, the sequential replay and the tests all go through it, so slot conservation
holds by construction and is checked in one place (`check`).

A request (sched.Request or cache.base.CacheReq) exposes `key` (tokens whose KV is computed),
`slots`, `cached_len`, `last_node`, `priority` and `extend_slots(new)`. Its slots are

    [0, cached_len)            the cache's: protected by the request's lock on last_node
    [cached_len, len(slots))   its own: computed KV not yet in the cache, then spare slots

Lifecycle: `admit` (match, lock, allocate) -> `grow` (chunks, decode pages) ->
`cache_req(finished=False)` after a prefill or chunk (others share it at once) ->
`cache_req(finished=True)` at the end, or `release` when retracted. Each call checks
everything before it changes anything: a refused or failed call leaves cache, pool and
request as they were.

Operator controls pass through here too: `tick(now)` gives the cache the engine's time (pins
expire, priorities date); a request with `pin_ttl` pins what its first `cache_req` stores (its
prompt, or first chunk); `guard(waiting)` keeps what waiting requests will hit out of the
eviction order while anything else is evictable (queue-aware eviction); and with a host tier an
admission whose match continues in host memory loads those pages back (`host_loaded`).
"""
from __future__ import annotations

import weakref
from typing import Any, Hashable, Iterable

import numpy as np

from radixkv.cache.base import MatchResult, PrefixCache
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS, OutOfSlotsError, SlotPool, round_up
from radixkv.argcheck import count


PIN_SHARE = 4          # the default pin budget: a quarter of the pool


class CacheManager:
    def __init__(self, cache: PrefixCache, pool: SlotPool):
        if pool.page_size != cache.page_size:
            raise ValueError(f"pool page size {pool.page_size} != cache page size {cache.page_size}")
        self.cache, self.pool, self.page_size = cache, pool, cache.page_size
        self.evicted_tokens = 0
        self._memo: dict[int, tuple] = {}       # id(owner) -> (owner, key, prefix_len, node, stamp)
        self._holders: dict[int, Any] = {}      # id(req) -> req, for every request holding slots
        self._kept: dict[int, tuple[int, Any]] = {}   # id(handle) -> (queue rank, handle) a waiting request will hit
        # requests whose pin_ttl was applied: a request pins once, not again when it is
        # re-admitted after a retraction (weak: a finished request is not kept alive)
        self._pinned: weakref.WeakSet = weakref.WeakSet()
        self.host = cache.host_tier()
        self._pins, self._guard, self._adm = cache.pins(), cache.guard(), cache.admission()
        if self._pins is not None and self._pins.budget is None:
            self._pins.budget = pool.num_slots // PIN_SHARE

    # ---- reads: never change the cache --------------------------------------------------------
    def budget(self) -> int:
        """Slots an allocation could get now: free plus evictable."""
        return self.pool.available() + self.cache.evictable_size()

    def peek(self, key: RadixKey) -> MatchResult:
        return self.cache.match_prefix(key, split=False)

    def cached_prefix(self, owner: Hashable, key: RadixKey) -> tuple[int, Any]:
        """(prefix_len, last_node) of `key`'s pure-read match, memoised per owner: reused while
        the cache says the match is still valid, so queue orders can ask every round (a cache
        without admission reads is asked every time)."""
        adm = self._adm
        if adm is None:
            m = self.cache.match_prefix(key, split=False)
            return m.prefix_len, m.last_node
        e = self._memo.get(id(owner))
        if e is not None and e[0] is owner and (e[1] is key or e[1] == key) \
                and adm.still_valid(e[3], e[4]):
            return e[2], e[3]
        m = self.cache.match_prefix(key, split=False)
        self._memo[id(owner)] = (owner, key, m.prefix_len, m.last_node, adm.stamp(m.last_node))
        return m.prefix_len, m.last_node

    def forget(self, owner: Hashable) -> None:
        self._memo.pop(id(owner), None)

    # ---- operator controls ----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """The engine's time: pins past their deadline return to the eviction order."""
        if self._pins is not None:
            self._pins.advance(now)

    def guard(self, waiting: Iterable[tuple[Hashable, RadixKey]]) -> int:
        """Queue-aware eviction: the entries these (owner, match key) pairs would hit, in queue
        order, are evicted only when nothing else is evictable, until the next call; then the
        entry whose first user is furthest back goes first. Returns how many are kept (0 for a
        cache with no eviction order to guard)."""
        g = self._guard
        if g is None:
            return 0
        kept: dict[int, tuple[int, Any]] = {}
        for rank, (owner, key) in enumerate(waiting):
            p, node = self.cached_prefix(owner, key)
            for h in g.hit_handles(key, node, p):
                kept.setdefault(id(h), (rank, h))
        self._kept = kept
        g.set(self._kept_rank if kept else None)
        return len(kept)

    def _kept_rank(self, handle: Any) -> int | None:
        e = self._kept.get(id(handle))
        return e[0] if e is not None else None

    def take_copies(self) -> list:
        """The host-tier copies queued since the last call, in order (the executor runs them
        before its next forward pass)."""
        return self.host.take_copies() if self.host is not None else []

    # ---- allocation ---------------------------------------------------------------------------
    def alloc(self, n: int) -> np.ndarray:
        """`n` slots in whole pages, evicting from the cache as needed. Raises OutOfSlotsError,
        changing nothing, when even evicting everything evictable would not make room."""
        need = round_up(n, self.page_size)
        if need > self.budget():
            raise OutOfSlotsError(f"asked for {n} slots; only {self.pool.available()} free and "
                                  f"{self.cache.evictable_size()} evictable")
        short = need - self.pool.available()
        if short > 0:
            freed = self.cache.evict(short)
            self.evicted_tokens += len(freed)
            self.pool.release(freed)                 # the cache's own slots: no re-check
        return self.pool.alloc(n)

    def admit(self, req, key: RadixKey, upto: int, reserve: int = 0) -> int | None:
        """Match `key` (splitting), lock the hit, and give `req` slots for its first `upto`
        tokens — [cached prefix | new], new rounded up to whole pages — while `reserve` slots
        stay spare for others. Returns the cached prefix length, or None when memory is short;
        then nothing changed: the refusal is decided on a pure read."""
        if id(req) in self._holders:
            raise ValueError(f"{req!r} already holds slots: admit it once")
        count(upto, "admit upto")
        count(reserve, "admit reserve")
        ps = self.page_size
        if round_up(upto, ps) + reserve > self.budget():
            # may not fit: decide on the pure read, counting what locking the hit would take
            # out of the evictable budget, so a refusal touches nothing (no split, no hit
            # counted, no access refreshed)
            p, node = self.cached_prefix(req, key)
            # without admission reads, the whole hit counts (never understated)
            cost = p if self._adm is None else self._adm.lock_cost(key, node, p)
            if round_up(upto, ps) - p + reserve > self.budget() - cost:
                return None
        m = self.cache.match_prefix(key, split=True)        # the one splitting match
        self.cache.inc_lock_ref(m.last_node)
        need = max(round_up(upto, ps) - m.prefix_len, 0)
        if need + reserve > self.budget():                   # only a cache whose lock_cost
            self.cache.dec_lock_ref(m.last_node)             # understates gets here
            return None
        got, slots, node = m.prefix_len, m.slots, m.last_node
        if self.host is not None:
            got, slots, node = self._load(req, key, m, upto)
        new = self.alloc(max(round_up(upto, ps) - got, 0))
        req.slots = np.concatenate([slots, new]) if got else new
        req.cached_len, req.last_node = got, node
        req.host_loaded = got - m.prefix_len
        self._holders[id(req)] = req
        self.forget(req)
        return got

    def _load(self, req, key: RadixKey, m: MatchResult, upto: int) -> tuple[int, np.ndarray, Any]:
        """Continue a device match `m` (locked) from the host tier: device slots for the host
        pages, a queued load, and the pages back in the device tree under the request's lock.
        At least one token of `upto` is left to compute."""
        ps, p = self.page_size, m.prefix_len
        cap = (upto - 1) - (upto - 1) % ps
        if cap <= p:
            return p, m.slots, m.last_node
        host = self.host
        assert host is not None, "a host load needs a host tier"
        h, host_slots, hnode = host.lookup(key[:cap])
        if h <= p:
            return p, m.slots, m.last_node
        host.hold(hnode)                             # demotions while making room keep it
        dev = self.alloc(h - p)
        host.release(hnode)
        host.load(dev, host_slots[p:h])
        slots = np.concatenate([m.slots, dev])
        res = self.cache.insert(key[:h], slots, priority=req.priority)
        self.cache.inc_lock_ref(res.last_node)
        self.cache.dec_lock_ref(m.last_node)
        return h, slots, res.last_node

    def grow(self, reqs: list, n_each: int) -> None:
        """Give each request `n_each` more slots, rounded up to whole pages (a decode page, a
        chunk), in one allocation."""
        for r in reqs:
            self._check_holder(r)
        n = round_up(n_each, self.page_size)
        if not reqs or n <= 0:
            return
        new = self.alloc(len(reqs) * n)
        for i, r in enumerate(reqs):
            r.extend_slots(new[i * n:(i + 1) * n])

    # ---- the cache takes its share --------------------------------------------------------------
    # Slot ranges when a request enters the cache. T = len(req.key), A = T rounded down to a
    # page, C = req.cached_len, P = insert(...).prefix_len (C <= P <= A):
    #
    #   [0, C)           cached      already the cache's; the request only moves or drops its lock
    #   [C, P)           duplicate   another request stored these tokens first: freed here; an
    #                                unfinished request switches to the cache's copies
    #   [P, A)           new         the cache owns them from now on
    #   [A, len(slots))  tail        finished: freed here; unfinished: kept for the next tokens

    def cache_req(self, req, finished: bool) -> np.ndarray:
        """Insert the request's computed tokens. Unfinished: it keeps running, its lock moves
        to the new last node. Finished: its lock and every slot the cache does not keep are
        released. Returns the slots freed (already back in the pool)."""
        T = self._check_share(req)
        if not self.cache.shares_prefixes:           # nothing is stored: the slots stay with it
            return self._drop(req) if finished else EMPTY_SLOTS
        A = T - T % self.page_size
        C, slots = req.cached_len, req.slots
        if self.host is not None and self.host.write_through:
            self.host.store(req.key[:A], slots[:A])  # read before any duplicate is freed
        res = self.cache.insert(req.key[:A], slots[:A], priority=req.priority,
                                tag=req.reuse_tag)
        P = res.prefix_len
        if req.pin_ttl > 0 and req not in self._pinned and A and self._pins is not None:
            self._pinned.add(req)
            try:
                self._pins.pin(req.key[:A], req.pin_ttl)
            except ValueError:                       # over the budget: counted, not fatal
                pass
        # req.last_node was checked above and nothing since can unlock or evict it: the
        # unchecked unlock (_dec_lock) skips a second check of the same handle
        if finished:
            freed = np.concatenate([slots[C:P], slots[A:]])
            self.pool.free(freed)
            self.cache._dec_lock(req.last_node)
            self._reset(req)
            return freed
        freed = slots[C:P].copy()
        if P > C:                                    # switch to the cache's copies
            slots = slots.copy()
            slots[C:P] = self.cache.match_prefix(req.key[:A], split=False).slots[C:P]
            req.slots = slots
        self.pool.free(freed)
        self.cache._check_handle(res.last_node)      # lock new before unlocking old: the shared
        self.cache._relock(req.last_node, res.last_node)     # path never becomes evictable
        req.cached_len, req.last_node = A, res.last_node
        return freed

    def release(self, req, insert: bool = False) -> None:
        """Take everything back from a request leaving without finishing (retraction, abort).
        With insert=True its computed KV enters the cache first, so a re-admission can hit."""
        if insert:
            self.cache_req(req, finished=False)      # checks everything before any change
        else:                                        # nothing is inserted: the key is not read
            self._check_holder(req)
            self.cache.check_lock(req.last_node)
        self._drop(req)

    def _drop(self, req) -> np.ndarray:
        freed = req.slots[req.cached_len:]
        self.pool.free(freed)
        self.cache.dec_lock_ref(req.last_node)
        self._reset(req)
        return freed

    def _reset(self, req) -> None:
        req.slots, req.cached_len, req.last_node = EMPTY_SLOTS, 0, None
        del self._holders[id(req)]

    def _check_holder(self, req) -> None:
        if self._holders.get(id(req)) is not req:
            raise ValueError(f"{req!r} holds no slots from this manager")

    def _check_share(self, req) -> int:
        """Every check cache_req and release need, before anything changes; returns len(key)."""
        self._check_holder(req)
        self.cache.check_lock(req.last_node)
        T = len(req.key)
        if not req.cached_len <= T <= len(req.slots):
            raise ValueError(f"{req!r}: {T} computed tokens but {len(req.slots)} slots and "
                             f"{req.cached_len} cached")
        return T

    # ---- checks -----------------------------------------------------------------------------------
    def holders(self) -> list:
        return list(self._holders.values())

    def check(self) -> None:
        """Cache invariants, slot conservation over the cache and every holder, and every lock
        the cache holds belonging to a holder."""
        self.cache.check_invariants(r.last_node for r in self._holders.values())
        self.pool.check_conservation(list(self.cache.held_slots())
                                     + [r.slots[r.cached_len:] for r in self._holders.values()])

    def reset(self) -> None:
        """Empty the cache and the pool; no request may hold slots."""
        if self._holders:
            raise ValueError(f"{len(self._holders)} requests still hold slots")
        self.cache.reset()
        self.pool.reset()
        self._memo.clear()
        self._kept = {}                              # the guard named the old tree's nodes
        if self._guard is not None:
            self._guard.set(None)
