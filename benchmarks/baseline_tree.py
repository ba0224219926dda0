"""A plain radix tree in the reference style, for side-by-side baselines in benchmarks.

Lists of ints per edge, a per-token comparison loop, and an eviction that rebuilds a heap
over every evictable leaf on each call. It is deliberately the straightforward design.
"""
from __future__ import annotations

import heapq
import time


class Node:
    def __init__(self, key: list, value: list, parent):
        self.key, self.value, self.parent = key, value, parent
        self.children: dict = {}
        self.lock_ref = 0
        self.last_access = time.monotonic()

    def __lt__(self, other):
        return self.last_access < other.last_access


def key_match(a: list, b: list) -> int:
    i = 0
    for x, y in zip(a, b):
        if x != y:
            break
        i += 1
    return i


class BaselineTree:
    def __init__(self):
        self.root = Node([], [], None)
        self.root.lock_ref = 1

    def match_prefix(self, key: list) -> tuple[list, Node]:
        node, value = self.root, []
        node.last_access = time.monotonic()
        while key and key[0] in node.children:
            child = node.children[key[0]]
            child.last_access = time.monotonic()
            n = key_match(child.key, key)
            if n < len(child.key):
                child = self._split(child, n)
                value += child.value
                node = child
                break
            value += child.value
            node, key = child, key[n:]
        return value, node

    def _split(self, child: Node, n: int) -> Node:
        new = Node(child.key[:n], child.value[:n], child.parent)
        new.lock_ref = child.lock_ref
        new.children = {child.key[n]: child}
        child.parent.children[child.key[0]] = new
        child.key, child.value, child.parent = child.key[n:], child.value[n:], new
        return new

    def insert(self, key: list, value: list) -> int:
        node, prefix = self.root, 0
        while key and key[0] in node.children:
            child = node.children[key[0]]
            child.last_access = time.monotonic()
            n = key_match(child.key, key)
            prefix += n
            if n < len(child.key):
                child = self._split(child, n)
            node, key, value = child, key[n:], value[n:]
        if key:
            node.children[key[0]] = Node(key, value, node)
        return prefix

    def leaves(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            if not n.children and n is not self.root and n.lock_ref == 0:
                out.append(n)
            stack.extend(n.children.values())
        return out

    def evict(self, num_tokens: int) -> list:
        heap = self.leaves()                      # rebuilt on every call
        heapq.heapify(heap)
        freed: list = []
        while len(freed) < num_tokens and heap:
            n = heapq.heappop(heap)
            freed += n.value
            del n.parent.children[n.key[0]]
            p = n.parent
            if not p.children and p is not self.root and p.lock_ref == 0:
                heapq.heappush(heap, p)
        return freed
