"""A multi-tenant radix tree over token ids: what a router remembers of the prompts it sent to
each replica (SGLang's router and Ray Serve's prefix router keep one, over characters; this one
is over tokens). Each node records, per tenant (replica), when a prompt through it was last
sent there; a tenant's size is the tokens of the nodes it is on, and `prune` drops a tenant's
least recently used leaves until it fits a size."""
from __future__ import annotations

import heapq
from collections.abc import Sequence


class _Node:
    __slots__ = ("edge", "children", "parent", "tenants")

    def __init__(self, edge: tuple, parent: _Node | None):
        self.edge = edge
        self.children: dict[int, _Node] = {}
        self.parent = parent
        self.tenants: dict[int, float] = {}       # tenant -> last access time


def _shared(a: tuple, b: tuple) -> int:
    """Length of the common prefix of a and b (slice compares, O(log n) of them)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n                  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class ApproxTree:
    def __init__(self) -> None:
        self.root = _Node((), None)
        self.sizes: dict[int, int] = {}            # tenant -> tokens

    def insert(self, tokens: Sequence[int], tenant: int, now: float) -> None:
        """Record that `tokens` were sent to `tenant` at `now`."""
        key = tuple(tokens)
        node, i = self.root, 0
        node.tenants[tenant] = now
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                child = _Node(key[i:], node)
                node.children[key[i]] = child
            else:
                k = _shared(child.edge, key[i:])
                if k < len(child.edge):
                    child = self._split(child, k)
            if tenant not in child.tenants:
                self.sizes[tenant] = self.sizes.get(tenant, 0) + len(child.edge)
            child.tenants[tenant] = now
            node, i = child, i + len(child.edge)

    def _split(self, child: _Node, k: int) -> _Node:
        """Cut child's edge after k tokens; returns the new upper node."""
        parent = child.parent
        upper = _Node(child.edge[:k], parent)
        upper.tenants = dict(child.tenants)
        parent.children[child.edge[0]] = upper
        child.edge = child.edge[k:]
        child.parent = upper
        upper.children[child.edge[0]] = child
        return upper

    def match(self, tokens: Sequence[int], tenants=None) -> tuple[int, dict[int, float]]:
        """(tokens matched, {tenant: last access} of the tenants holding that whole match),
        following only nodes that one of `tenants` (None: any) holds. Unmatched: (0, {})."""
        key = tuple(tokens)
        node, i, holders = self.root, 0, {}
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                break
            held = {t: a for t, a in child.tenants.items() if tenants is None or t in tenants}
            if not held:
                break
            k = _shared(child.edge, key[i:])
            i, holders = i + k, held
            if k < len(child.edge):
                break
            node = child
        return i, holders

    def smallest_tenants(self, tenants: Sequence[int]) -> list[int]:
        """The tenants among `tenants` whose size is the smallest."""
        low = min(self.sizes.get(t, 0) for t in tenants)
        return [t for t in tenants if self.sizes.get(t, 0) == low]

    def prune(self, max_size: int) -> int:
        """Drop each tenant's least recently used leaves until its size is at most max_size;
        returns the tokens dropped."""
        dropped = 0
        for tenant, size in list(self.sizes.items()):
            if size > max_size:
                dropped += self._prune_tenant(tenant, size - max_size)
        return dropped

    def _prune_tenant(self, tenant: int, excess: int) -> int:
        heap = [(n.tenants[tenant], id(n), n) for n in self._nodes(tenant)
                if not any(tenant in c.tenants for c in n.children.values())]
        heapq.heapify(heap)
        dropped = 0
        while heap and dropped < excess:
            _, _, node = heapq.heappop(heap)
            del node.tenants[tenant]
            dropped += len(node.edge)
            parent = node.parent
            if not node.tenants and not node.children:
                del parent.children[node.edge[0]]
            if parent is not self.root and tenant in parent.tenants and \
                    not any(tenant in c.tenants for c in parent.children.values()):
                heapq.heappush(heap, (parent.tenants[tenant], id(parent), parent))
        self.sizes[tenant] -= dropped
        return dropped

    def _nodes(self, tenant: int):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            if tenant in n.tenants:
                yield n
                stack.extend(n.children.values())
