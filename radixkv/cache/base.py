"""The prefix-cache contract. Every cache (RadixCache, BlockHashCache, NoCache) implements it.

Ownership: a cache never frees KV memory. Methods that drop entries return the freed slot
indices; the caller hands them to the one SlotPool. Slots are 1-D int64 numpy arrays.

The public methods here check their arguments once, then call the variant's `_`-prefixed
implementation: bad input (a non-key, negative or non-int token ids, a slot count that differs
from the token count, a negative eviction size, unlocking an unlocked or foreign handle) raises
ValueError/TypeError naming the value before any state changes — a failed call leaves the
cache exactly as it was. Implementations receive validated arguments only.

A *handle* (the type parameter H) is what a match or an insert returns as `last_node`: the
cache entry ending it (RadixCache: a TreeNode; BlockHashCache: a Chain of blocks; NoCache:
None). Lock a handle to keep its prefix from eviction.

The contract is the operations below and `label`; what only some caches can do sits behind an
accessor returning None when the cache lacks it (cache/abilities.py): `events`, `pins`,
`tree`, `guard`, `admission`, `host_tier`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Hashable, Iterable, NamedTuple, TypeVar

import numpy as np

from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS, as_slots
from radixkv.argcheck import an_int, count, positive_int

if TYPE_CHECKING:
    from radixkv.cache.abilities import (Admission, EventLog, EvictionGuard, HostStore, Pins,
                                         TreeView)

H = TypeVar("H")     # a variant's handle type


class MatchResult(NamedTuple, Generic[H]):
    prefix_len: int          # tokens of the key whose KV is cached (page aligned)
    slots: np.ndarray        # their KV slots, shape [prefix_len]
    last_node: H             # the handle ending the match: lock it to protect the prefix


class InsertResult(NamedTuple, Generic[H]):
    prefix_len: int          # tokens that were already cached: the caller's slots there are duplicates
    last_node: H             # the handle ending the inserted (page-aligned) key


@dataclass(eq=False)
class CacheReq:
    """The minimal request shape the CacheManager needs (sched.Request has the same fields).

    `slots[i]` holds the KV of `key[i]` for i < len(key); slots beyond len(key) are the spare
    part of the request's last page. `slots[:cached_len]` belong to the cache and are protected
    by the request's lock on `last_node`.
    """
    key: RadixKey
    slots: np.ndarray = field(default_factory=lambda: EMPTY_SLOTS)
    cached_len: int = 0
    last_node: Any = None
    priority: int = 0
    pin_ttl: float = 0.0     # > 0: pin the prompt for this many seconds once it is cached
    host_loaded: int = 0     # tokens of its last admission loaded from the host tier
    reuse_tag: Hashable = None   # its signature for the reuse order (orders.reuse_signature)

    def extend_slots(self, new: np.ndarray) -> None:
        self.slots = np.concatenate([self.slots, new])


def as_key(key) -> RadixKey:
    """Accept a RadixKey, or a plain sequence of token ids (default namespace)."""
    return key if isinstance(key, RadixKey) else RadixKey(key)



class PrefixCache(ABC, Generic[H]):
    """A prefix cache over KV slots. Sizes are in tokens."""

    name: str = ""               # registry name: radix | blockhash | none
    shares_prefixes = True       # False: nothing is ever stored (the no-cache control)

    def __init__(self, page_size: int = 1, what: str = "page_size"):
        self.page_size = positive_int(page_size, what)

    # ---- the operations: checked here, implemented by the variant ---------------------------
    def match_prefix(self, key, split: bool = True) -> MatchResult[H]:
        """Longest cached, page-aligned prefix of `key`.

        split=True may mutate: it refreshes access bookkeeping along the matched path and, in a
        tree, splits an edge where the key diverges mid-edge so `last_node` ends exactly at
        `prefix_len`. split=False mutates nothing at all (a pure read, safe for routers and
        for schedulers that only ask); its `last_node` may end before `prefix_len`, so lock
        only what a splitting match returned. Raises TypeError/ValueError for a bad key.
        """
        return self._match(as_key(key), bool(split))

    def insert(self, key, slots, priority: int = 0, tag: Hashable = None) -> InsertResult[H]:
        """Store `key` (its whole pages; a partial last page is not stored) with `slots`
        (len(slots) == len(key)). Mutates. Returns how much was already cached: the caller's
        slots in [already-owned prefix, prefix_len) are duplicates the caller must free; the
        cache owns the slots of the newly stored range from now on. `tag` is the inserting
        request's signature, which a learning eviction order (`reuse`) predicts reuse from;
        other orders ignore it. Raises ValueError, changing nothing, for a slot count that
        differs from the token count, a negative slot or an unhashable tag."""
        key, slots = as_key(key), as_slots(slots)
        if len(slots) != len(key):
            raise ValueError(f"insert got {len(slots)} slots for {len(key)} tokens")
        if slots.size and slots.min() < 0:
            raise ValueError(f"slot {int(slots.min())} is negative")
        try:
            hash(tag)
        except TypeError:
            raise ValueError(f"insert tag {tag!r} is not hashable") from None
        return self._insert(key, slots, an_int(priority, "priority"), tag)

    def evict(self, num_tokens: int) -> np.ndarray:
        """Drop at least `num_tokens` unlocked tokens when possible (fewer if not enough are
        evictable), in the cache's eviction order. Mutates; returns the freed slots, which
        the caller must hand back to its SlotPool (the cache never frees). Raises ValueError
        for a negative count."""
        return self._evict(count(num_tokens, "evict"))

    def inc_lock_ref(self, node: H) -> None:
        """Protect `node` and everything it depends on from eviction (mutates the sizes).
        Raises TypeError/ValueError, changing nothing, for a foreign or evicted handle."""
        self._check_handle(node)
        self._inc_lock(node)

    def dec_lock_ref(self, node: H) -> None:
        """Undo one inc_lock_ref (mutates). Raises, changing nothing, if `node` is not locked."""
        self.check_lock(node)
        self._dec_lock(node)

    def check_lock(self, node: H) -> None:
        """Raise exactly when dec_lock_ref(node) would (foreign, evicted or unlocked handle);
        a pure read."""
        self._check_handle(node)
        self._check_locked(node)

    # ---- sizes ------------------------------------------------------------------------------
    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens that evict() could free now (a pure read)."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens held but locked (a pure read)."""

    def total_size(self) -> int:
        """Tokens held (a pure read)."""
        return self.evictable_size() + self.protected_size()

    @abstractmethod
    def held_slots(self) -> Iterable[np.ndarray]:
        """Every slot the cache holds, for the pool's conservation check (a pure read)."""

    @abstractmethod
    def num_entries(self) -> int:
        """Entries held (tree nodes, blocks; 0 for no cache): the footprint a replay reports
        at its peak (a pure read)."""

    # ---- whole-cache operations -------------------------------------------------------------
    @abstractmethod
    def reset(self) -> None:
        """Drop everything (mutates). Slots held are not returned: reset the pool too."""

    def check_invariants(self, lock_holders: Iterable[H] | None = None) -> None:
        """Assert every structural invariant (a pure read; AssertionError with a precise
        message). With `lock_holders`, the handles of every lock taken on the cache's behalf
        by its callers (one per lock), also that the cache holds exactly those locks: a leaked
        lock would pin its prefix forever."""
        self._check_structure()
        if lock_holders is not None:
            holders = list(lock_holders)
            held, owned = self._locks_held(), sum(map(self._lock_units, holders))
            if held != owned:
                raise AssertionError(f"the cache holds {held} lock units but its "
                                     f"{len(holders)} requests hold {owned}: a lock was "
                                     f"leaked or lost")

    def stats(self) -> dict[str, int]:
        """Counters for reports (a pure read): `entries` (tree nodes, blocks) and the
        variant's own (pins, orphan and duplicate blocks, the host tier's)."""
        return {"entries": self.num_entries()}

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str,
                 evict_granularity: str = "page") -> str:
        """Name plus the options that matter to this variant: "radix p1 lru", "radix p1 lru
        node-evict", "blockhash b16 sha256", "none" (CacheConfig.label uses it before any
        cache is built)."""
        return cls.name if page_size == 1 else f"{cls.name} p{page_size}"

    @property
    def label(self) -> str:
        return self.describe(self.page_size, "lru", "sha256")

    # ---- optional abilities: None where the cache lacks them (cache/abilities.py) -----------
    def events(self) -> EventLog | None:
        """The KV events this cache records; None unless it was built with events on."""
        return None

    def pins(self) -> Pins | None:
        """Its pinned prefixes and the clock they expire by; None: it cannot pin."""
        return None

    def tree(self) -> TreeView[H] | None:
        """Its prefix tree, read only; None: it has no tree to walk."""
        return None

    def guard(self) -> EvictionGuard[H] | None:
        """Queue-aware eviction; None: it has no eviction order to guard."""
        return None

    def admission(self) -> Admission[H] | None:
        """Pure reads for admission (memo stamps, lock cost); None: ask the cache again every
        time and count the whole prefix as the lock's cost (which never understates)."""
        return None

    def host_tier(self) -> HostStore | None:
        """The host-memory tier below this cache (cache/host_tier.py), or None."""
        return None

    # ---- what a variant implements (arguments already checked) ------------------------------
    @abstractmethod
    def _match(self, key: RadixKey, split: bool) -> MatchResult[H]: ...

    @abstractmethod
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag: Hashable
                ) -> InsertResult[H]: ...

    @abstractmethod
    def _evict(self, num_tokens: int) -> np.ndarray: ...

    @abstractmethod
    def _check_handle(self, node: Any) -> None:
        """Raise TypeError/ValueError unless `node` is a live handle of this cache."""

    @abstractmethod
    def _check_locked(self, node: H) -> None:
        """Raise ValueError unless a live handle holds a lock of its own that can be undone."""

    @abstractmethod
    def _inc_lock(self, node: H) -> None: ...

    @abstractmethod
    def _dec_lock(self, node: H) -> None: ...

    def _relock(self, old: H, new: H) -> None:
        """Move one lock from `old` to `new`, both checked: lock `new`, then unlock `old`, so
        what they share never becomes evictable in between."""
        self._inc_lock(new)
        self._dec_lock(old)

    @abstractmethod
    def _check_structure(self) -> None:
        """check_invariants without the lock holders."""

    @abstractmethod
    def _locks_held(self) -> int:
        """Lock units outstanding that callers took (not the cache's own, such as pins')."""

    @abstractmethod
    def _lock_units(self, node: H) -> int:
        """What one inc_lock_ref(node) adds to _locks_held()."""
