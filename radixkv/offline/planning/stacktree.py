"""The unlimited cache's radix tree with recency stamps, for the one-pass LRU curves
(`radixkv.offline.planning.onepass`, whose module docstring says why they serve every
capacity): a request's path pages ranked by recency, 1 = most recent.

The tree is built as the pass goes and split wherever a request's path ends or diverges, so
every page of a node was last touched by the same request; a Fenwick tree over stamps weighted
by page counts gives the pages more recent than a node, so a path costs O(nodes on it x log).
"""
from __future__ import annotations

import numpy as np

from radixkv.cache.key import RadixKey

NEVER = np.int64(1) << 62           # rank of a page the unlimited cache has never held


class Fenwick:
    """Page counts per stamp; `newer(s)` = pages at stamps > s. Grows by doubling."""

    def __init__(self, size: int = 1 << 12):
        self.n, self.tree, self.total = size, [0] * (size + 1), 0
        self.w = [0] * (size + 1)                 # plain weights, to rebuild on growth

    def add(self, s: int, v: int) -> None:
        if s > self.n:
            self._grow(s)
        self.w[s] += v
        self.total += v
        t, n = self.tree, self.n
        while s <= n:
            t[s] += v
            s += s & -s

    def newer(self, s: int) -> int:
        t, acc, i = self.tree, 0, min(s, self.n)
        while i > 0:
            acc += t[i]
            i -= i & -i
        return self.total - acc

    def _grow(self, s: int) -> None:
        n = self.n
        while n < s:
            n *= 2
        w = self.w + [0] * (n - self.n)
        tree = [0] + w[1:]
        for i in range(1, n + 1):                 # O(n) Fenwick build
            j = i + (i & -i)
            if j <= n:
                tree[j] += tree[i]
        self.n, self.w, self.tree = n, w, tree


class Node:
    """A node of the unlimited cache's tree: `key` is its edge (a RadixKey of whole pages),
    `depth` the page index its edge starts at, `base` the stable id of its first page (pages
    keep their id across splits), `stamp` its last touch."""
    __slots__ = ("key", "children", "stamp", "npages", "depth", "base")

    def __init__(self, key: RadixKey, stamp: int, npages: int, depth: int, base: int):
        self.key, self.children = key, {}
        self.stamp, self.npages, self.depth, self.base = stamp, npages, depth, base


class StampTree:
    """The unlimited cache's radix tree with recency stamps (see the module docstring)."""

    def __init__(self, page_size: int):
        self.ps = page_size                                   # tokens per page
        self.roots: dict[tuple, Node] = {}
        self.fen = Fenwick()
        self.stamp = 0
        self.pages = 0                                        # page ids handed out

    def walk(self, key: RadixKey, A: int) -> tuple[list[Node], bool]:
        """The path of the first `A` whole pages of `key`, splitting nodes where it ends or
        diverges; the last node is new (never held) when the second value is True."""
        root = self.roots.get(key.namespace)
        if root is None:
            root = self.roots[key.namespace] = Node(RadixKey(), 0, 0, 0, 0)
        ps, node, pos, path = self.ps, root, 0, []
        while pos < A:
            child = node.children.get(key.page(pos, ps))
            if child is None:
                leaf = Node(key[pos * ps:A * ps], 0, A - pos, pos, self.pages)
                self.pages += A - pos
                node.children[key.page(pos, ps)] = leaf
                path.append(leaf)
                return path, True
            # >= 1: the first page matched
            n = min(child.npages, A - pos, key.shared(child.key, pos * ps) // ps)
            if n < child.npages:
                child = self._split(node, child, n)
            path.append(child)
            pos += n
            node = child
        return path, False

    def _split(self, parent: Node, child: Node, n: int) -> Node:
        """Cut `child` after n pages; the upper part keeps the stamp (the Fenwick weight at it
        is unchanged: both parts are still there, the lower one deeper)."""
        ps = self.ps
        upper = Node(child.key[:n * ps], child.stamp, n, child.depth, child.base)
        parent.children[child.key.page(0, ps)] = upper
        child.key, child.npages = child.key[n * ps:], child.npages - n
        child.depth, child.base = child.depth + n, child.base + n
        upper.children[child.key.page(0, ps)] = child
        return upper

    def ranks(self, path: list[Node], new: bool) -> np.ndarray:
        """(len(path),) rank of each node's first page before this request (1 = most recent);
        a node's pages rank consecutively from there. NEVER for a new node."""
        fen = self.fen
        r = [fen.newer(n.stamp) + 1 for n in (path[:-1] if new else path)]
        if new:
            r.append(int(NEVER))
        return np.array(r, np.int64)

    def touch(self, path: list[Node], new: bool) -> None:
        """Restamp the path, the root-most newest."""
        fen = self.fen
        for i, n in enumerate(reversed(path)):
            self.stamp += 1
            if not (new and i == 0):
                fen.add(n.stamp, -n.npages)
            n.stamp = self.stamp
            fen.add(n.stamp, n.npages)


class PathRanks:
    """One request's path pages as rank segments: node i holds pages [d0[i], d0[i] + w[i])
    ranked R[i] ... R[i] + w[i] - 1. `count(x)`: pages ranked <= x (a prefix of the path)."""
    __slots__ = ("R", "w", "d0")

    def __init__(self, R: np.ndarray, w: np.ndarray, d0: np.ndarray):
        self.R, self.w, self.d0 = R, w, d0

    def count(self, x: np.ndarray) -> np.ndarray:
        if not len(self.R):
            return np.zeros_like(x)
        i = np.searchsorted(self.R, x, "right") - 1
        j = np.maximum(i, 0)
        got = self.d0[j] + np.minimum(self.w[j], x - self.R[j] + 1)
        return np.where(i >= 0, got, 0)
