"""A host-memory tier below the device radix tree (as SGLang's HiCache).

The host tier is a second radix tree over its own pool of host slots. Ranges leave the device
tree into it: at eviction (write-back) or as soon as they are inserted (write-through; an
eviction then finds them there and copies nothing). A match that reaches past the device
prefix into host-resident pages loads them back (`CacheManager.admit`) before the request
runs. Host space is reclaimed in LRU order, a whole page at a time; the host tree never locks
except around a load.

Every byte moved is a `Copy` queued in order; the scheduler hands them to the executor with
the next plan, which performs them in that order before its forward pass (the simulator
charges them at the host link's bandwidth; the torch executor copies the tensors). Queue
order makes reuse safe: a device slot freed by a demotion is read by its store before any
later load or forward writes it.
"""
from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np

from radixkv.cache.key import RadixKey
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.argcheck import choice, positive_int

WRITE_POLICIES = ("write_back", "write_through")


class Copy(NamedTuple):
    kind: str              # "store" (device -> host) or "load" (host -> device)
    device: np.ndarray     # device slots
    host: np.ndarray       # host slots, aligned with `device`


class HostTier:
    def __init__(self, capacity: int, page_size: int = 1, write_policy: str = "write_back"):
        self.capacity = positive_int(capacity, "host_kv_tokens")
        self.write_policy = choice(write_policy, "host write policy", WRITE_POLICIES)
        self.pool = SlotPool(capacity, page_size)
        self.tree = RadixCache(page_size, "lru", clock=itertools.count().__next__,
                               evict_granularity="page")
        self.page_size = page_size
        self.reset()

    @property
    def write_through(self) -> bool:
        return self.write_policy == "write_through"

    def reset(self) -> None:
        self.tree.reset()
        self.pool.reset()
        self._copies: list[Copy] = []
        self.stored_tokens = self.loaded_tokens = self.dropped_tokens = 0
        self.hits = 0

    # ---- device -> host ---------------------------------------------------------------------
    def demote(self, key: RadixKey, device_slots: np.ndarray) -> int:
        """A device range is about to be freed: keep a copy (write-back) or check the copy
        written through is still here. Returns the tokens copied."""
        return self.store(key, device_slots)

    def store(self, key: RadixKey, device_slots: np.ndarray) -> int:
        """Copy what the host tree lacks of `key` (whole pages; device_slots[i] holds key[i])."""
        A = len(key) - len(key) % self.page_size
        m = self.tree.match_prefix(key[:A], split=True)
        h = m.prefix_len
        room = min(A - h, self.capacity - self.capacity % self.page_size)
        if room <= 0:
            return 0
        self.tree.inc_lock_ref(m.last_node)       # the path we extend stays while making room
        short = room - self.pool.available()
        if short > 0:
            dropped = self.tree.evict(short)
            self.dropped_tokens += len(dropped)
            self.pool.free(dropped)
        room = min(room, self.pool.available())
        room -= room % self.page_size
        self.tree.dec_lock_ref(m.last_node)
        if room <= 0:
            return 0
        host = self.pool.alloc(room)
        self._copies.append(Copy("store", np.asarray(device_slots[h:h + room]).copy(), host))
        self.tree.insert(key[:h + room], np.concatenate([m.slots, host]))
        self.stored_tokens += room
        return room

    # ---- host -> device ---------------------------------------------------------------------
    def lookup(self, key: RadixKey) -> tuple[int, np.ndarray, object]:
        """(host prefix length, its host slots, the host handle to lock during a load);
        refreshes the host tree's recency."""
        m = self.tree.match_prefix(key, split=True)
        return m.prefix_len, m.slots, m.last_node

    def hold(self, handle: Any) -> None:
        """Keep a looked-up host prefix while the device makes room for it (demotions evict)."""
        self.tree.inc_lock_ref(handle)

    def release(self, handle: Any) -> None:
        self.tree.dec_lock_ref(handle)

    def load(self, device_slots: np.ndarray, host_slots: np.ndarray) -> None:
        self._copies.append(Copy("load", np.asarray(device_slots).copy(),
                                 np.asarray(host_slots).copy()))
        self.loaded_tokens += len(device_slots)
        self.hits += 1

    def take_copies(self) -> list[Copy]:
        out, self._copies = self._copies, []
        return out

    def pending(self) -> int:
        return len(self._copies)

    # ---- inspection -------------------------------------------------------------------------
    def size(self) -> int:
        return self.tree.total_size()

    def stats(self) -> dict[str, int]:
        return {"host_tokens": self.size(), "host_stored_tokens": self.stored_tokens,
                "host_loaded_tokens": self.loaded_tokens, "host_hits": self.hits,
                "host_dropped_tokens": self.dropped_tokens}

    def check_invariants(self) -> None:
        self.tree.check_invariants()
        self.pool.check_conservation(self.tree.held_slots())
        assert self.tree.protected_size() == 0, "a host lock outlived its load"
