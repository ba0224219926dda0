"""FutureOracle: Belady's eviction for simulations, where every future request is known.

A radix tree over all future prompts (built once) gives, for each of its nodes, the sorted
indices of the requests whose prompt covers that node. A cached leaf's next use is the first
not-yet-admitted request covering the leaf's first page; `--eviction belady` evicts the leaf
whose next use is furthest ahead (never = infinitely far). It is the practical upper bound
every real policy is measured against.
"""
from __future__ import annotations

import bisect
import math
from typing import Sequence

import numpy as np

from radixkv.cache.radix import RadixCache
from radixkv.cache.radix.node import TreeNode, path_key


class FutureOracle:
    def __init__(self, requests: Sequence, page_size: int = 1):
        """`requests`: objects with `.prompt_key` (RadixKey) and `.index` (arrival order)."""
        self.page_size = page_size
        self.tree = RadixCache(clock=lambda: 0.0)
        for r in requests:
            self.tree.insert(r.prompt_key, np.zeros(len(r.prompt_key), dtype=np.int64))
        self._users: dict[int, list[int]] = {}       # id(future node) -> request indices
        for r in sorted(requests, key=lambda r: r.index):
            node = self.tree.node_covering(r.prompt_key)
            while node is not None and node is not self.tree.root:
                self._users.setdefault(id(node), []).append(r.index)
                node = node.parent
        self._admitted: set[int] = set()
        self._cursor = 0                             # smallest index not admitted yet
        self._n = len(requests)

    def admitted(self, req) -> None:
        self._admitted.add(req.index)
        while self._cursor in self._admitted:
            self._cursor += 1

    def next_use(self, node: TreeNode) -> float:
        """Arrival index of the next request that will use `node`, or inf."""
        path = path_key(node)
        start = len(path) - len(node.key)
        f = self.tree.node_covering(path[:start + self.page_size])    # up to its first page
        if f is None:
            return math.inf
        users = self._users.get(id(f), ())
        i = bisect.bisect_left(users, self._cursor)
        while i < len(users) and users[i] in self._admitted:
            i += 1
        return float(users[i]) if i < len(users) else math.inf
