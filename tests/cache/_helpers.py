"""Shared helpers for the cache tests: an injectable clock and exact tree snapshots."""
from __future__ import annotations

import numpy as np

from radixkv.cache.key import RadixKey


class FakeClock:
    """A settable clock: `clock.t = 5` makes every later reading 5.0. Counts its readings."""

    def __init__(self, t: float = 0.0):
        self.t = float(t)
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.t


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def node_snapshot(n) -> tuple:
    kids = tuple(sorted((node_snapshot(c) for c in n.children.values()), key=repr))
    return (n.key.namespace, tuple(n.key.tokens), tuple(n.value.tolist()), n.lock_ref,
            n.last_access, n.created, n.hit_count, n.priority, n.id,
            None if n.hashes is None else tuple(n.hashes), n.retain, n.sig, n.touch, kids)


def tree_snapshot(tree) -> tuple:
    """Everything observable about a RadixCache: structure, bookkeeping, sizes, heap."""
    # heap entries end with (version, node); whatever precedes them is the sort key
    heap = tuple(sorted((repr(e[:-2]), e[-2], e[-1].id) for e in tree._heap))
    return (node_snapshot(tree.root), tree.total_size(), tree.evictable_size(),
            tree.protected_size(), tree.num_nodes(), len(tree._heap), heap)


def shape(n) -> list:
    """[(edge length, shape of children)] sorted by the edge's first token."""
    return [(len(c.key), shape(c))
            for c in sorted(n.children.values(), key=lambda c: (repr(c.key.namespace), c.key.tokens[0]))]


def depth_len(node) -> int:
    """Tokens from the root to the end of `node`."""
    total = 0
    while node.parent is not None:
        total += len(node.key)
        node = node.parent
    return total


def all_nodes(tree) -> list:
    out, stack = [], [tree.root]
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


def slots_of(*arrays) -> list[int]:
    return np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays]).tolist()


def key(tokens, ns=(None, None)) -> RadixKey:
    return RadixKey(tokens, extra_key=ns[0], cache_salt=ns[1])
