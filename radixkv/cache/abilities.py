"""What a cache can do beyond the contract, each behind an accessor on PrefixCache that returns
None when the cache lacks it (cache/base.py): the caller asks once and branches on None, never
on the cache's type.

- `events()`     -> EventLog       the KV events it records (a cache built with events on)
- `pins()`       -> Pins           pinned prefixes and the caller's clock they expire by
- `tree()`       -> TreeView       its prefix tree, for a scheduler that walks it
- `guard()`      -> EvictionGuard  queue-aware eviction: entries kept until nothing else is left
- `admission()`  -> Admission      pure reads an admission decides on: memo stamps, lock cost
- `host_tier()`  -> HostStore      the host-memory tier below it

`EventLog` is the one implementation every cache with events uses; the others are protocols a
variant's collaborators implement (cache/radix/, cache/blockhash/).
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

import numpy as np

from radixkv.cache.events import EventRun, KVEvent, run_pages
from radixkv.cache.key import RadixKey

H = TypeVar("H")
H_in = TypeVar("H_in", contravariant=True)      # a handle only passed in


class EventLog:
    """The KV-event records of one cache, oldest first, as the cache appends them: an EventRun
    per run of pages (a tree node stored or evicted, a run of new blocks), or "cleared" on an
    explicit reset. `held` computes the chained hashes of every page the cache holds now."""

    def __init__(self, held: Callable[[], set[int]]):
        self._runs: list[EventRun] = []
        self._held = held

    def record(self, run: EventRun) -> None:
        self._runs.append(run)

    def clear(self) -> None:
        """Forget what was recorded and not taken (mutates; a fresh cache starts so)."""
        self._runs.clear()

    def take(self) -> list[KVEvent]:
        """The events since the last take, one KVEvent a page (mutates: they are consumed)."""
        return run_pages(self.take_runs())

    def take_runs(self) -> list[EventRun]:
        """The same, as recorded: for a consumer that takes runs whole (KVIndex.apply_kv)."""
        runs, self._runs = self._runs, []
        return runs

    def page_hashes(self) -> set[int]:
        """What a subscriber applying every event taken so far and still pending holds: the
        chained hash of every page the cache holds now (a pure read)."""
        return self._held()


class Pins(Protocol):
    """Pinned prefixes: a pin locks the cached prefix of a key until a deadline of the caller's
    clock. The clock lives here because pins are what it expires; a retention order dates
    priorities by it too."""

    budget: int | None

    def advance(self, now: float) -> None:
        """The caller's time in seconds; pins past their deadline are dropped. Never goes back."""

    def pin(self, key, ttl: float) -> int:
        """Keep the cached prefix of `key` for `ttl` seconds (again: a later deadline); returns
        its length. Raises ValueError, changing nothing, when no page of `key` is cached, ttl
        is not positive, or the pinned size would pass the budget."""

    def unpin(self, key) -> int:
        """Drop `key`'s pin now; returns its length. Raises ValueError if it is not pinned."""

    def pinned_size(self) -> int:
        """Tokens held by pins (the union of the pinned prefixes)."""


class TreeView(Protocol[H]):
    """A prefix tree's shape, read only: the root, a node's parent (None at the root) and its
    children in creation order."""

    def root(self) -> H: ...
    def parent(self, node: H) -> H | None: ...
    def children(self, node: H) -> list[H]: ...


class EvictionGuard(Protocol[H]):
    """Entries `keep` gives a rank (not None) are evicted only when nothing else is evictable,
    the highest rank first; None: no guard (mutates the eviction order's inputs only)."""

    def set(self, keep: Callable[[H], int | None] | None) -> None: ...

    def hit_handles(self, key: RadixKey, node: H, prefix_len: int) -> list[H]:
        """The evictable entries a splitting match of `key` would hit, given its pure read
        (`node`, `prefix_len`): what the guard must keep for that request. A pure read."""


class Admission(Protocol[H_in]):
    """Pure reads an admission decides on without touching the cache."""

    def stamp(self, node: H_in) -> Any:
        """An opaque stamp taken with a pure-read match ending at `node`."""

    def still_valid(self, node: H_in, stamp: Any) -> bool:
        """True when a pure-read match that ended at `node` with `stamp` would still give the
        same answer, so a memo may reuse it."""

    def lock_cost(self, key: RadixKey, node: H_in, prefix_len: int) -> int:
        """Tokens that locking a splitting match of `key` would move from evictable to
        protected, given its pure read (`node`, `prefix_len`)."""


class HostStore(Protocol):
    """The host-memory tier below a device cache (cache/host_tier.py). The tree hands every
    range it evicts to `demote` before the slots go back, and resets, reports and checks the
    tier with itself; the CacheManager stores finished requests through it (write-through),
    looks up and loads what the device lacks, and takes the queued copies for the executor.
    The tier builds on the tree, never the other way round."""

    write_through: bool

    def demote(self, key: RadixKey, device_slots: np.ndarray) -> int: ...
    def store(self, key: RadixKey, device_slots: np.ndarray) -> int: ...
    def lookup(self, key: RadixKey) -> tuple[int, np.ndarray, object]: ...
    def hold(self, handle: Any) -> None: ...
    def release(self, handle: Any) -> None: ...
    def load(self, device_slots: np.ndarray, host_slots: np.ndarray) -> None: ...
    def take_copies(self) -> list[Any]: ...
    def reset(self) -> None: ...
    def stats(self) -> dict[str, int]: ...
    def check_invariants(self) -> None: ...
