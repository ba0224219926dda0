"""The prefix-cache contract. Every cache (RadixCache, BlockHashCache, NoCache) implements it.

Ownership: a cache never frees KV memory. Methods that drop entries return the freed slot
indices; the caller hands them to the one SlotPool. Slots are 1-D int64 numpy arrays.

The public methods here check their arguments once, then call the variant's `_`-prefixed
implementation: bad input (a non-key, negative or non-int token ids, a slot count that differs
from the token count, a negative eviction size, unlocking an unlocked or foreign handle) raises
ValueError/TypeError naming the value before any state changes — a failed call leaves the
cache exactly as it was. Implementations receive validated arguments only.

A *handle* is what a match or an insert returns as `last_node`: the cache entry ending it (a
tree node, a chain of blocks, None). Lock a handle to keep its prefix from eviction.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable, NamedTuple, Protocol

import numpy as np

from radixkv.cache.events import EventRun, KVEvent
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS, as_slots
from radixkv.argcheck import an_int, count, positive_int


class MatchResult(NamedTuple):
    prefix_len: int          # tokens of the key whose KV is cached (page aligned)
    slots: np.ndarray        # their KV slots, shape [prefix_len]
    last_node: Any           # the handle ending the match: lock it to protect the prefix


class InsertResult(NamedTuple):
    prefix_len: int          # tokens that were already cached: the caller's slots there are duplicates
    last_node: Any           # the handle ending the inserted (page-aligned) key


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


class HostStore(Protocol):
    """What a device cache asks of the host-memory tier below it (cache/host_tier.py): the tree
    hands every range it evicts to `demote` before the slots go back, and resets, reports and
    checks the tier with itself. The tier builds on the tree, never the other way round."""

    def demote(self, key: RadixKey, device_slots: np.ndarray) -> int: ...
    def reset(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def check_invariants(self) -> None: ...


class PrefixCache(ABC):
    """A prefix cache over KV slots. Sizes are in tokens."""

    name: str = ""               # registry name: radix | blockhash | none
    shares_prefixes = True       # False: nothing is ever stored (the no-cache control)
    enable_events = False        # True: KV events are recorded (take_events, page_hashes)

    def __init__(self, page_size: int = 1, what: str = "page_size"):
        self.page_size = positive_int(page_size, what)

    # ---- the operations: checked here, implemented by the variant ---------------------------
    @abstractmethod
    def reset(self) -> None:
        """Drop everything (mutates). Slots held are not returned: reset the pool too."""

    def match_prefix(self, key, split: bool = True) -> MatchResult:
        """Longest cached, page-aligned prefix of `key`.

        split=True may mutate: it refreshes access bookkeeping along the matched path and, in a
        tree, splits an edge where the key diverges mid-edge so `last_node` ends exactly at
        `prefix_len`. split=False mutates nothing at all (a pure read, safe for routers and
        for schedulers that only ask); its `last_node` may end before `prefix_len`, so lock
        only what a splitting match returned.
        """
        return self._match(as_key(key), bool(split))

    def insert(self, key, slots, priority: int = 0, tag: Hashable = None) -> InsertResult:
        """Store `key` (its whole pages; a partial last page is not stored) with `slots`
        (len(slots) == len(key)). Mutates. Returns how much was already cached: the caller's
        slots in [already-owned prefix, prefix_len) are duplicates the caller must free; the
        cache owns the slots of the newly stored range from now on. `tag` is the inserting
        request's signature, which a learning eviction order (`reuse`) predicts reuse from;
        other orders ignore it."""
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
        evictable), in the cache's eviction order. Mutates; returns the freed slots."""
        return self._evict(count(num_tokens, "evict"))

    def inc_lock_ref(self, node: Any) -> None:
        """Protect `node` and everything it depends on from eviction (mutates sizes)."""
        self._check_handle(node)
        self._inc_lock(node)

    def dec_lock_ref(self, node: Any) -> None:
        """Undo one inc_lock_ref. Raises, changing nothing, if `node` is not locked."""
        self.check_lock(node)
        self._dec_lock(node)

    def check_lock(self, node: Any) -> None:
        """Raise exactly when dec_lock_ref(node) would (foreign, evicted or unlocked handle);
        a pure read."""
        self._check_handle(node)
        self._check_locked(node)

    # ---- sizes and inspection ---------------------------------------------------------------
    @abstractmethod
    def evictable_size(self) -> int:
        """Tokens that evict() could free now."""

    @abstractmethod
    def protected_size(self) -> int:
        """Tokens held but locked by running requests."""

    def total_size(self) -> int:
        return self.evictable_size() + self.protected_size()

    def locks_held(self) -> int:
        """Lock units outstanding (a pure read): with `lock_units`, a manager checks that every
        lock belongs to a request it holds — a leaked lock would pin its prefix forever."""
        return 0

    def lock_units(self, node: Any) -> int:
        """What one inc_lock_ref(node) adds to locks_held()."""
        return 0

    def num_entries(self) -> int:
        """Entries held (tree nodes, blocks): the footprint a replay reports at its peak."""
        return 0

    def stats(self) -> dict[str, int]:
        """Variant-specific counters for reports (e.g. orphan and duplicate blocks); a pure read."""
        return {}

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str,
                 evict_granularity: str = "node") -> str:
        """Name plus the options that matter to this variant: "radix p1 lru", "radix p1 lru
        node-evict", "blockhash b16 sha256", "none" (CacheConfig.label uses it before any cache
        is built)."""
        return cls.name if page_size == 1 else f"{cls.name} p{page_size}"

    @property
    def label(self) -> str:
        return self.describe(self.page_size, "lru", "sha256")

    @abstractmethod
    def held_slots(self) -> Iterable[np.ndarray]:
        """Every slot the cache holds (for the pool's conservation check)."""

    @abstractmethod
    def check_invariants(self) -> None:
        """Assert every structural invariant; raises AssertionError with a precise message."""

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (empty unless the cache was built with events on)."""
        return []

    def take_event_runs(self) -> list[KVEvent | EventRun]:
        """take_events(), as the cache records them: an EventRun per run of pages where the
        cache keeps runs (RadixCache: per node; BlockHashCache: per run of new blocks and per
        eviction), else its KVEvents. For a consumer that can take runs whole
        (KVIndex.apply_kv); events.run_pages gives the KVEvents."""
        return self.take_events()

    def page_hashes(self) -> set[int]:
        """The chained hashes of every page the cache holds now: what a subscriber applying
        this cache's events holds (a pure read). Raises ValueError unless events are on."""
        if not self.enable_events:
            raise ValueError(f"{self.label}: page_hashes needs a cache built with enable_events=True")
        return self._page_hashes()

    # ---- operator controls (a cache without them: no-ops, or a ValueError naming it) --------
    def advance(self, now: float) -> None:
        """The caller's time in seconds (the engine's clock): pins whose deadline has passed
        are dropped, and the retention order dates priorities by it. Never goes back."""

    def pin(self, key, ttl: float) -> int:
        """Keep the cached prefix of `key` from eviction for `ttl` seconds of `advance` time
        (again: a later deadline). Returns the pinned length. Raises ValueError, changing
        nothing, when no page of `key` is cached, ttl is not positive, or the pinned size would
        pass the pin budget."""
        return self._pin(as_key(key), ttl)

    def unpin(self, key) -> int:
        """Drop `key`'s pin now (its prefix returns to the eviction order); returns its
        length. Raises ValueError, changing nothing, when `key` is not pinned."""
        return self._unpin(as_key(key))

    def _pin(self, key: RadixKey, ttl: float) -> int:
        raise ValueError(f"the {self.label} cache cannot pin prefixes")

    def _unpin(self, key: RadixKey) -> int:
        raise ValueError(f"the {self.label} cache cannot pin prefixes")

    def pinned_size(self) -> int:
        """Tokens held by pins (the union of pinned prefixes)."""
        return 0

    def default_pin_budget(self, tokens: int) -> None:
        """The pin budget, unless one was configured (the manager passes a share of its pool)."""

    def set_eviction_guard(self, keep: Callable[[Any], int | None] | None) -> None:
        """Entries `keep` returns a rank for (not None) are evicted only when nothing else is
        evictable, the highest rank first (the queue position of their first waiting user);
        None: no guard. Caches without an eviction order ignore it."""

    def hit_handles(self, key: RadixKey, node: Any, prefix_len: int) -> list:
        """The evictable entries a splitting match of `key` would hit at its end, given its
        pure read (`node`, `prefix_len`): what a guard must keep for that request."""
        return []

    def host_tier(self) -> HostStore | None:
        """The host-memory tier below this cache (cache/host_tier.py), or None."""
        return None

    # ---- capabilities the scheduler asks about (instead of testing types) -------------------
    def match_stamp(self, node: Any) -> Any:
        """An opaque stamp taken with a pure-read match ending at `node`."""
        return None

    def match_valid(self, node: Any, stamp: Any) -> bool:
        """True when a pure-read match that ended at `node` with `stamp` would still return the
        same answer, so a memo may reuse it. The default never reuses: ask again."""
        return False

    def lock_cost(self, key: RadixKey, node: Any, prefix_len: int) -> int:
        """Tokens that locking a splitting match of `key` would move from evictable to
        protected, given its pure read (`node`, `prefix_len`); a pure read. The default, the
        whole prefix, never understates."""
        return prefix_len

    def tree_root(self) -> Any:
        """The root of the cache's prefix tree, or None when it has no tree to walk."""
        return None

    def tree_children(self, node: Any) -> list:
        """A tree node's children in creation order (trees only)."""
        return []

    def tree_parent(self, node: Any) -> Any:
        """A tree node's parent; None for the root (trees only)."""
        return None

    # ---- what a variant implements (arguments already checked) ------------------------------
    @abstractmethod
    def _match(self, key: RadixKey, split: bool) -> MatchResult: ...

    @abstractmethod
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag: Hashable
                ) -> InsertResult: ...

    @abstractmethod
    def _evict(self, num_tokens: int) -> np.ndarray: ...

    def _page_hashes(self) -> set[int]:
        return set()

    @abstractmethod
    def _check_handle(self, node: Any) -> None:
        """Raise TypeError/ValueError unless `node` is a live handle of this cache."""

    @abstractmethod
    def _check_locked(self, node: Any) -> None:
        """Raise ValueError unless a live handle holds a lock of its own that can be undone."""

    @abstractmethod
    def _inc_lock(self, node: Any) -> None: ...

    @abstractmethod
    def _dec_lock(self, node: Any) -> None: ...

    def _relock(self, old: Any, new: Any) -> None:
        """Move one lock from `old` to `new`, both checked: lock `new`, then unlock `old`, so
        what they share never becomes evictable in between."""
        self._inc_lock(new)
        self._dec_lock(old)
