"""The radix tree's node: an edge's token run and KV slots, its place in the tree, and the
bookkeeping the eviction orders and the controls read (cache/radix/tree.py builds the tree of
them)."""
from __future__ import annotations

import itertools

import numpy as np

from radixkv.cache.key import RadixKey

node_ids = itertools.count()       # TreeNode ids: creation order (fifo, filo and ties read it)


class TreeNode:
    """A radix cache's handle: lock it to protect the path from the root through its edge."""
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


def is_candidate(n: TreeNode) -> bool:
    """An unlocked leaf still in the tree: what eviction may take."""
    return n.lock_ref == 0 and not n.children and n.parent is not None


def path_key(node: TreeNode) -> RadixKey:
    """The whole key from the root through `node`'s edge."""
    parts = []
    while node.parent is not None:
        parts.append(node.key)
        node = node.parent
    return RadixKey.concat(reversed(parts))


def path_slots(node: TreeNode) -> np.ndarray:
    """The slots of the whole path from the root through `node`'s edge."""
    parts = []
    while node.parent is not None:
        parts.append(node.value)
        node = node.parent
    return np.concatenate(parts[::-1])


def node_id(n: TreeNode) -> int:
    return n.id
