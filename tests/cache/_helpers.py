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
            None if n.hashes is None else tuple(n.hashes), n.retain, n.sig, n.touch, n.depth, kids)


def tree_snapshot(tree) -> tuple:
    """Everything observable about a RadixCache: structure, bookkeeping, sizes, heap."""
    # heap entries end with (version, node); whatever precedes them is the sort key
    heap = tuple(sorted((repr(e[:-2]), e[-2], e[-1].id) for e in tree.evictor.heap))
    return (node_snapshot(tree.root), tree.total_size(), tree.evictable_size(),
            tree.protected_size(), tree.num_nodes(), len(tree.evictor.heap), heap)


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


def edge_prefixes(tree, step: int):
    """(namespace, token prefix, node, i) for every `step`-th token i of every edge: the prefix
    runs from the root through token i + step - 1 of `node`'s edge."""
    from radixkv.cache.radix.node import path_key
    for n in all_nodes(tree):
        if n is tree.root:
            continue
        path = path_key(n)
        base = len(path) - len(n.key)
        for i in range(0, len(n.key), step):
            yield path.namespace, tuple(path.tokens[:base + i + step]), n, i


def check_tree_and_pool(tree, pool, cached_tokens: int) -> None:
    """Tree invariants, slot conservation over the tree alone, and its total size."""
    tree.check_invariants()
    pool.check_conservation(tree.held_slots())
    assert tree.total_size() == cached_tokens


def slots_of(*arrays) -> list[int]:
    return np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays]).tolist()


def key(tokens, ns=(None, None)) -> RadixKey:
    return RadixKey(tokens, extra_key=ns[0], cache_salt=ns[1])
