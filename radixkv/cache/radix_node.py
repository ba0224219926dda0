"""The radix tree's node: an edge's token run and KV slots, its place in the tree, and the
bookkeeping the eviction orders and the controls read (cache/radix.py builds the tree of them)."""
from __future__ import annotations

import itertools

import numpy as np

from radixkv.cache.key import RadixKey

node_ids = itertools.count()       # TreeNode ids: creation order (fifo, filo and ties read it)


class TreeNode:
    __slots__ = ("id", "key", "value", "parent", "children", "lock_ref", "last_access",
                 "created", "hit_count", "priority", "hashes", "hv", "cv", "retain", "sig", "touch",
                 "depth")

    def __init__(self, key: RadixKey, value: np.ndarray, parent: "TreeNode | None", now: float):
        self.id = next(node_ids)
        self.key, self.value, self.parent = key, value, parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = self.created = now
        self.hit_count = self.priority = 0
        self.hashes: list[int] | None = None      # one chained hash per page (events on)
        self.hv = 0                               # version of this node's live heap entry
        self.cv = 0                               # bumped whenever `children` changes
        self.retain = 0.0                         # the retention order's decaying priority stamp
        self.sig = self.touch = None              # the reuse order's (see cache/orders.py)
        self.depth = 0                            # tokens on the path above this node's edge

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


def path_key(node: TreeNode) -> RadixKey:
    """The whole key from the root through `node`'s edge."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return RadixKey.concat(reversed(parts))


def node_id(n: TreeNode) -> int:
    return n.id
