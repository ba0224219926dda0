"""Pinned prefixes: a pin is a lock on a cached prefix with a deadline, inside a token budget.

`PinTable` is the radix tree's `pins()` ability (cache/abilities.py: Pins) and owns the
caller's clock: `advance(now)` moves it (never back) and drops every pin whose deadline has
passed. `pin(key, ttl)` locks the cached part of `key` until `now + ttl`; pinning the same key
again moves its deadline; `unpin(key)` drops one now; either unlocks, so the prefix goes back
into the eviction order exactly as if a request had finished with it. The pinned size is the
union of the pinned paths (a shared system prompt counts once); a pin that would take it over
the budget raises ValueError and changes nothing. Pin locks are not request locks:
`locks()` tells the cache how many of its lock units are pins'.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, NamedTuple

from radixkv.cache.key import RadixKey
from radixkv.argcheck import finite_at_least


def _key(key) -> RadixKey:
    return key if isinstance(key, RadixKey) else RadixKey(key)


class Pin(NamedTuple):
    node: Any              # the locked handle ending the pinned prefix
    tokens: int            # the pinned prefix length
    deadline: float


class PinTable:
    def __init__(self, cache: Any, budget: int | None = None):
        self.cache = cache
        self.budget = None if budget is None else int(finite_at_least(budget, "max_pinned_tokens", 0))
        self.refused = 0
        self.now = 0.0                            # the caller's time: deadlines, retention dates
        self.clear()

    def clear(self) -> None:
        """Forget every pin (the cache was reset: its locks went with the tree)."""
        self._pins: dict[RadixKey, Pin] = {}
        self._deadlines: list[tuple[float, int, RadixKey]] = []   # lazy: checked against _pins
        self._seq = 0

    def locks(self) -> int:
        return len(self._pins)

    def __len__(self) -> int:
        return len(self._pins)

    def __contains__(self, key: RadixKey) -> bool:
        return key in self._pins

    def pinned_size(self) -> int:
        """Tokens of the union of the pinned paths."""
        return sum(len(n.key) for n in self._pinned_nodes())

    def _pinned_nodes(self) -> set:
        seen: dict[int, Any] = {}
        for pin in self._pins.values():
            n = pin.node
            while n.parent is not None and id(n) not in seen:
                seen[id(n)] = n
                n = n.parent
        return set(seen.values())

    def advance(self, now: float) -> None:
        """The caller's time in seconds; pins past their deadline go. Never goes back."""
        self.now = max(self.now, float(now))
        self.expire(self.now)

    def pin(self, key, ttl: float) -> int:
        """Lock the cached prefix of `key` until now + ttl; returns its length. Raises
        ValueError, changing nothing, when no page of it is cached, ttl is not positive or the
        pinned size would pass the budget."""
        key = _key(key)
        ttl = finite_at_least(ttl, "pin ttl", 0)
        if not ttl > 0:
            raise ValueError(f"pin ttl must be positive, got {ttl!r}")
        deadline = self.now + ttl
        old = self._pins.get(key)
        if old is not None:                       # a pin again: a new deadline, nothing locked
            self._set(key, old._replace(deadline=max(old.deadline, deadline)))
            return old.tokens
        m = self.cache.match_prefix(key, split=False)
        if m.prefix_len == 0:
            raise ValueError(f"pin: no page of the {len(key)}-token key is cached: nothing to pin")
        added = self._new_tokens(key, m.last_node, m.prefix_len)
        if self.budget is not None and self.pinned_size() + added > self.budget:
            self.refused += 1
            raise ValueError(f"pin of {m.prefix_len} tokens ({added} not pinned yet) would take "
                             f"the pinned size {self.pinned_size()} over max_pinned_tokens "
                             f"{self.budget}")
        hit = self.cache.match_prefix(key[:m.prefix_len], split=True)
        self.cache.inc_lock_ref(hit.last_node)
        self._set(key, Pin(hit.last_node, hit.prefix_len, deadline))
        return hit.prefix_len

    def _new_tokens(self, key: RadixKey, node: Any, prefix_len: int) -> int:
        """Tokens a pin ending at the pure read (`node`, `prefix_len`) adds to the union."""
        pinned = {id(n) for n in self._pinned_nodes()}
        depth, added, n = node.depth + len(node.key), 0, node
        while n.parent is not None:
            added += 0 if id(n) in pinned else len(n.key)
            n = n.parent
        if prefix_len > depth:                    # part of the next edge: its own node once split
            child = self.cache.edge_below(node, key, depth)
            added += 0 if child is not None and id(child) in pinned else prefix_len - depth
        return added

    def _set(self, key: RadixKey, pin: Pin) -> None:
        self._pins[key] = pin
        self._seq += 1
        heapq.heappush(self._deadlines, (pin.deadline, self._seq, key))

    def unpin(self, key) -> int:
        """Drop the pin of `key` now; returns the tokens it held. Raises if `key` is not pinned."""
        key = _key(key)
        pin = self._pins.get(key)
        if pin is None:
            raise ValueError(f"unpin: the {len(key)}-token key is not pinned")
        del self._pins[key]
        self.cache.dec_lock_ref(pin.node)
        return pin.tokens

    def expire(self, now: float) -> int:
        """Drop the pins whose deadline is at or before `now`; returns how many."""
        dropped = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, key = heapq.heappop(self._deadlines)
            pin = self._pins.get(key)
            if pin is not None and pin.deadline == deadline:
                self.unpin(key)
                dropped += 1
        return dropped

    def check(self) -> None:
        for key, pin in self._pins.items():
            assert pin.node.lock_ref > 0, f"pinned {pin.node!r} is not locked"
            n = pin.node
            while n.parent is not None:
                n = n.parent
            assert n is self.cache.root, f"pinned {pin.node!r} left the tree"
        if self.budget is not None:
            assert self.pinned_size() <= self.budget, \
                f"pinned size {self.pinned_size()} > max_pinned_tokens {self.budget}"

    def next_deadline(self) -> float:
        return min((p.deadline for p in self._pins.values()), default=math.inf)
