"""Stateful eviction orders: a sort key that also hears what the tree does.

A plain order (cache/policies.py) is a function of one node's bookkeeping. An EvictionOrder is
an object called the same way, with hooks the radix tree calls: `used(node, priority, now, tag)`
when a request's insert passes through a node, `created(...)` when it makes one (`now` is the caller's time,
`advance(now)`; `tag` the request's signature), and
`hit(node)` when a splitting match counts a hit on a node, and `evicted(node, key)` with the
sort key of every node it drops. All stay O(1): the tree re-pushes a candidate whose key
changed, so no order ever rescans the heap.

- `cost` — GreedyDual-Size-Frequency. A leaf's value per token freed is
  H = L + frequency * recompute_cost(depth, tokens) / tokens, where recompute_cost is the time
  to prefill its tokens after the `depth` tokens above it (deeper tokens attend over a longer
  context, so they cost more) and frequency is its hit count + 1. The smallest H goes first;
  L, the inflation value, becomes the H of each evicted leaf, so a leaf not used for a while
  falls behind newer ones without any key being recomputed.
- `reuse` — learned reuse prediction, in the manner of SHiP (signature-based hit predictor,
  Wu et al., MICRO 2011). Each insert carries its request's signature (`reuse_signature`: the
  request's turn in its session, and how much of it was already cached, in powers of two), and
  each signature a saturating counter: +1 when a node it created is hit for the first time, -1
  when one leaves the cache never hit (one outcome per insertion: when an edge splits, the
  prefix half keeps the signature). A node remembers the last signature that inserted through
  it; a leaf not hit since, whose signature's counter is 0, is predicted dead and goes first
  (LRU among those), then the rest in LRU order, so a finished conversation's whole path goes
  before live ones. As in SHiP, the prediction is made when an insert touches the node and
  kept until the next one: a counter that dips to 0 for a moment marks that moment's inserts,
  not every leaf of its signature (measured: re-predicting them all computes 3 % more
  prefill on the default run). Nodes a host-tier load re-creates carry no signature. The
  counters learn online: nothing is declared.
- `retention` — priority that decays: every use stamps `now + horizon * priority` and the node
  keeps the largest stamp (the max over its users). A node used at priority p outlives an
  unprioritised node used up to p * horizon seconds later; then it ages like any other.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

from radixkv.argcheck import finite_at_least, int_at_least, is_int

TokenCost = Callable[[int, int], float]

# Attention FLOPs per (query, context) token over linear FLOPs per token, Llama-3-8B:
# 4 * 32 layers * 32 heads * 128 / (2 * 7.5e9 parameters). Only ratios matter to the order.
ATTN_PER_LINEAR = 3.5e-5


def analytic_token_cost(depth: int, n: int) -> float:
    """Relative prefill cost of n tokens after `depth` cached ones: linear work plus attention
    over the context (sum of (c + 1) for c in [depth, depth + n)); the simulator injects the
    cost model's figure instead."""
    return n + ATTN_PER_LINEAR * (n * depth + n * (n + 1) / 2)


class EvictionOrder:
    """A sort key with hooks; the defaults ignore them."""

    def __call__(self, n) -> tuple:
        raise TypeError(f"{type(self).__name__} does not define a sort key")

    def used(self, n, priority: int, now: float, tag: Hashable = None) -> None:
        """A request's insert passed through `n` (before `n` is re-keyed)."""

    def created(self, n, priority: int, now: float, tag: Hashable = None) -> None:
        """A request's insert created `n` (its parent is set, its sort key not yet taken)."""
        self.used(n, priority, now, tag)

    def hit(self, n) -> None:
        """A splitting match counted a hit on `n` (its hit_count already includes it)."""

    def evicted(self, n, key: tuple) -> None:
        """`n`, with sort key `key`, left the cache."""


class CostOrder(EvictionOrder):
    def __init__(self, token_cost: TokenCost = analytic_token_cost):
        if not callable(token_cost):
            raise ValueError(f"cost order: token_cost must be callable, got {token_cost!r}")
        self.token_cost = token_cost
        self.inflation = 0.0                       # L

    def __call__(self, n) -> tuple:
        size = len(n.key)
        per_token = self.token_cost(n.depth, size) / size if size else 0.0
        return (self.inflation + (n.hit_count + 1) * per_token, n.id)

    def evicted(self, n, key: tuple) -> None:
        self.inflation = max(self.inflation, key[0])


def reuse_signature(turn: int | None, cached_tokens: int) -> tuple:
    """A request's signature for the `reuse` order: its turn in its session (None without a
    session; capped at 15) and the bit length of its cached prefix at first admission (a
    one-shot retrieval behind a system prompt and a chat turn behind the few-shot block fall
    in different buckets)."""
    return (None if turn is None else min(turn, 15), int(cached_tokens).bit_length())


class ReuseOrder(EvictionOrder):
    def __init__(self, bits: int = 2, initial: int | None = None):
        self.max = (1 << int_at_least(bits, "reuse counter bits", 1)) - 1
        self.initial = self.max if initial is None else initial
        if not is_int(self.initial) or not 0 <= self.initial <= self.max:
            raise ValueError(f"reuse order: initial counter {initial!r} is not an int in "
                             f"[0, {self.max}]")
        self.counters: dict[Hashable, int] = {}    # signature -> saturating reuse counter

    def predicted_dead(self, n) -> bool:
        # touch: (last inserting signature, hit_count then, its counter was 0 then)
        t = n.touch
        return t is not None and t[2] and n.hit_count == t[1]

    def __call__(self, n) -> tuple:
        return (not self.predicted_dead(n), n.last_access, n.id)

    def _add(self, sig: Hashable, d: int) -> None:
        self.counters[sig] = min(self.max, max(0, self.counters.get(sig, self.initial) + d))

    def used(self, n: Any, priority: int, now: float, tag: Hashable = None) -> None:
        if tag is not None:                        # the prediction is made here, once
            n.touch = (tag, n.hit_count, self.counters.get(tag, self.initial) == 0)

    def created(self, n: Any, priority: int, now: float, tag: Hashable = None) -> None:
        n.sig = tag                                # the signature whose counter n teaches
        self.used(n, priority, now, tag)

    def hit(self, n) -> None:
        if n.hit_count == 1 and n.sig is not None:
            self._add(n.sig, +1)

    def evicted(self, n, key: tuple) -> None:
        if n.hit_count == 0 and n.sig is not None:
            self._add(n.sig, -1)


class RetentionOrder(EvictionOrder):
    def __init__(self, horizon: float = 30.0):
        self.horizon = finite_at_least(horizon, "retention horizon", 0)

    def __call__(self, n) -> tuple:
        return (n.retain, n.last_access, n.id)

    def used(self, n: Any, priority: int, now: float, tag: Hashable = None) -> None:
        n.retain = max(n.retain, now + self.horizon * max(priority, 0))
