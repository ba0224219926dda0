"""The prefix-cache contract. Every cache (RadixCache, BlockHashCache, NoCache) implements it.

Ownership: a cache never frees KV memory. Methods that drop entries return the freed slot
indices; the caller hands them to the one SlotPool. Slots are 1-D int64 numpy arrays.

Bad input (a non-key, negative or non-int token ids, a slot count that differs from the token
count, unlocking an unlocked node, a negative eviction size) raises ValueError/TypeError that
names the value, before any state changes: a failed call leaves the cache exactly as it was.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

import numpy as np

from radixkv.cache.events import KVEvent
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS


class MatchResult(NamedTuple):
    prefix_len: int          # tokens of the key whose KV is cached (page aligned)
    slots: np.ndarray        # their KV slots, shape [prefix_len]
    last_node: Any           # the cache entry ending the match: lock it to protect the prefix


class InsertResult(NamedTuple):
    prefix_len: int          # tokens that were already cached: the caller's slots there are duplicates
    last_node: Any           # the entry ending the inserted (page-aligned) key


@dataclass(eq=False)
class CacheReq:
    """The minimal request shape the request-level helpers need.

    `slots[i]` holds the KV of `key[i]` for i < len(key); slots beyond len(key) are the spare
    part of the request's last page. `slots[:cached_len]` belong to the cache and are protected
    by the request's lock on `last_node`.
    """
    key: RadixKey
    slots: np.ndarray = field(default_factory=lambda: EMPTY_SLOTS)
    cached_len: int = 0
    last_node: Any = None
    priority: int = 0


class PrefixCache(ABC):
    """A prefix cache over KV slots. Sizes are in tokens."""

    page_size: int = 1

    @abstractmethod
    def reset(self) -> None:
        """Drop everything (mutates). Slots held are not returned: reset the pool too."""

    @abstractmethod
    def match_prefix(self, key: RadixKey, split: bool = True) -> MatchResult:
        """Longest cached, page-aligned prefix of `key`.

        split=True may mutate: it refreshes access bookkeeping along the matched path and, in a
        tree, splits an edge where the key diverges mid-edge so `last_node` ends exactly at
        `prefix_len`. split=False mutates nothing at all (a pure read, safe for routers and
        for schedulers that only ask); its `last_node` may end before `prefix_len`, so lock
        only what a splitting match returned.
        """

    @abstractmethod
    def insert(self, key: RadixKey, slots, priority: int = 0) -> InsertResult:
        """Store `key` (its whole pages; a partial last page is not stored) with `slots`
        (len(slots) == len(key)). Mutates. Returns how much was already cached: the caller's
        slots in [already-owned prefix, prefix_len) are duplicates the caller must free; the
        cache owns the slots of the newly stored range from now on."""

    @abstractmethod
    def evict(self, num_tokens: int) -> np.ndarray:
        """Drop at least `num_tokens` unlocked tokens when possible (fewer if not enough are
        evictable), in the cache's eviction order. Mutates; returns the freed slots."""

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> None:
        """Protect `node` and everything it depends on from eviction (mutates sizes)."""

    @abstractmethod
    def dec_lock_ref(self, node: Any) -> None:
        """Undo one inc_lock_ref. Raises, changing nothing, if `node` is not locked."""

    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens that evict() could free now."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens held but locked by running requests."""

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    @abstractmethod
    def held_slots(self) -> Iterable[np.ndarray]:
        """Every slot the cache holds (for the pool's conservation check)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Assert every structural invariant; raises AssertionError with a precise message."""

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (empty unless the cache was built with events on)."""
        return []

    # ---- request-level helpers ------------------------------------------------------------
    # Slot ranges of a request when it enters the cache. T = len(req.key), A = T rounded down
    # to a page, C = req.cached_len, P = insert(...).prefix_len (C <= P <= A):
    #
    #   range            what              who frees it
    #   [0, C)           cached            the cache (already its own; the request only unlocks)
    #   [C, P)           duplicate         the caller: another request stored these tokens first;
    #                                      an unfinished request switches to the cache's copies
    #   [P, A)           new               the cache: insert handed them over
    #   [A, len(slots))  tail (partial     finished: the caller; unfinished: the request keeps
    #                    page and spare)   them and goes on writing decode tokens there

    def cache_finished_req(self, req: CacheReq) -> np.ndarray:
        """Insert a finished request's tokens and release its lock. Returns slots to free."""
        T = len(req.key)
        A = T - T % self.page_size
        res = self.insert(req.key[:A], req.slots[:A], priority=req.priority)
        to_free = np.concatenate([req.slots[req.cached_len:res.prefix_len], req.slots[A:]])
        if req.last_node is not None:
            self.dec_lock_ref(req.last_node)
        req.last_node, req.cached_len, req.slots = None, 0, EMPTY_SLOTS
        return to_free

    def cache_unfinished_req(self, req: CacheReq) -> np.ndarray:
        """Insert a running request's tokens so others can share them, and move its lock to the
        new last node. Returns the duplicate slots to free; the request keeps the rest."""
        T = len(req.key)
        A = T - T % self.page_size
        res = self.insert(req.key[:A], req.slots[:A], priority=req.priority)
        to_free = req.slots[req.cached_len:res.prefix_len].copy()
        m = self.match_prefix(req.key[:A], split=False)     # the path now ends exactly at A
        slots = req.slots.copy()
        slots[:m.prefix_len] = m.slots
        self.inc_lock_ref(m.last_node)                        # lock new before unlocking old:
        if req.last_node is not None:                         # the shared path never becomes
            self.dec_lock_ref(req.last_node)                  # evictable in between
        req.slots, req.cached_len, req.last_node = slots, m.prefix_len, m.last_node
        return to_free


def as_key(key) -> RadixKey:
    """Accept a RadixKey, or a plain sequence of token ids (default namespace)."""
    return key if isinstance(key, RadixKey) else RadixKey(key)
