"""Stateful eviction orders: a sort key that also hears what the tree does.

A plain order (cache/policies.py) is a function of one node's bookkeeping. An EvictionOrder is
an object called the same way, with two hooks the radix tree calls: `used(node, priority, now)`
when a request's insert passes through a node (`now` is the caller's time, `advance(now)`), and
`evicted(key)` with the sort key of every node it drops. Both stay O(1): the tree re-pushes a
candidate whose key changed, so no order ever rescans the heap.

- `cost` — GreedyDual-Size-Frequency. A leaf's value per token freed is
  H = L + frequency * recompute_cost(depth, tokens) / tokens, where recompute_cost is the time
  to prefill its tokens after the `depth` tokens above it (deeper tokens attend over a longer
  context, so they cost more) and frequency is its hit count + 1. The smallest H goes first;
  L, the inflation value, becomes the H of each evicted leaf, so a leaf not used for a while
  falls behind newer ones without any key being recomputed.
- `retention` — priority that decays: every use stamps `now + horizon * priority` and the node
  keeps the largest stamp (the max over its users). A node used at priority p outlives an
  unprioritised node used up to p * horizon seconds later; then it ages like any other.
"""
from __future__ import annotations

from typing import Any, Callable

from radixkv.validate import finite_at_least

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

    def used(self, n, priority: int, now: float) -> None:
        """A request's insert passed through `n` (before `n` is re-keyed)."""

    def evicted(self, key: tuple) -> None:
        """A node with sort key `key` left the cache."""


def _depth(n) -> int:
    """Tokens above `n`'s edge (its parents' edges)."""
    d, p = 0, n.parent
    while p is not None:
        d += len(p.key)
        p = p.parent
    return d


class CostOrder(EvictionOrder):
    def __init__(self, token_cost: TokenCost = analytic_token_cost):
        if not callable(token_cost):
            raise ValueError(f"cost order: token_cost must be callable, got {token_cost!r}")
        self.token_cost = token_cost
        self.inflation = 0.0                       # L

    def __call__(self, n) -> tuple:
        size = len(n.key)
        per_token = self.token_cost(_depth(n), size) / size if size else 0.0
        return (self.inflation + (n.hit_count + 1) * per_token, n.id)

    def evicted(self, key: tuple) -> None:
        self.inflation = max(self.inflation, key[0])


class RetentionOrder(EvictionOrder):
    def __init__(self, horizon: float = 30.0):
        self.horizon = finite_at_least(horizon, "retention horizon", 0)

    def __call__(self, n) -> tuple:
        return (n.retain, n.last_access, n.id)

    def used(self, n: Any, priority: int, now: float) -> None:
        n.retain = max(n.retain, now + self.horizon * max(priority, 0))
