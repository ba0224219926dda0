"""The radix tree's inspection: the slots it holds, a printout, and `check_invariants` (structure,
sizes, locks, heap entries of candidates, no slot held twice, pins and the host tier).
`TreeChecks` is a part of `RadixCache` (cache/radix.py), reading its tree."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from radixkv.cache.radix_node import TreeNode


class TreeChecks:
    def held_slots(self) -> Iterable[np.ndarray]:
        return [n.value for n in self._nodes() if n is not self.root]

    def pretty_print(self, max_tokens: int = 6) -> str:
        lines: list[str] = []

        def walk(n: TreeNode, depth: int) -> None:
            for c in sorted(n.children.values(), key=lambda c: c.key.tokens[:1]):
                toks = c.key.tokens
                head = ", ".join(map(str, toks[:max_tokens])) + (", ..." if len(toks) > max_tokens else "")
                ns = "" if c.key.namespace == (None, None) else f" ns={c.key.namespace}"
                lines.append(f"{'  ' * depth}[{head}] len={len(toks)} lock={c.lock_ref}{ns}")
                walk(c, depth + 1)
        walk(self.root, 0)
        lines.append(f"total={self.total_size()} evictable={self._evictable} "
                     f"protected={self._protected} nodes={self._num_nodes}")
        text = "\n".join(lines)
        print(text)
        return text

    def check_invariants(self) -> None:
        ps, ev, pr, count = self.page_size, 0, 0, 0
        live = {id(e[-1]) for e in self._heap if e[-2] == e[-1].hv}
        seen_slots: list[np.ndarray] = []
        assert self.root.lock_ref >= 1, f"root lock_ref {self.root.lock_ref} < 1"
        for n in self._nodes():
            count += 1
            for ck, c in n.children.items():
                assert c.parent is n, f"{c!r} has a wrong parent pointer"
                assert ck == self._child_key(n, c.key, 0), f"{c!r} stored under a wrong child-key"
                assert c.lock_ref <= n.lock_ref, f"lock_ref {c.lock_ref} of {c!r} > parent's {n.lock_ref}"
                if n is not self.root:
                    assert c.key.namespace == n.key.namespace, f"{c!r} mixes namespaces with its parent"
            if n is self.root:
                continue
            L = len(n.key)
            assert L > 0, f"{n!r} has an empty key"
            assert len(n.value) == L, f"{n!r} holds {len(n.value)} slots for {L} tokens"
            assert L % ps == 0, f"{n!r} key length {L} is not a multiple of page_size {ps}"
            assert n.lock_ref >= 0, f"{n!r} has negative lock_ref"
            assert n.depth == n.parent.depth + len(n.parent.key), f"{n!r} has a wrong depth"
            if n.lock_ref:
                pr += L
            else:
                ev += L
            if self._is_candidate(n):
                assert id(n) in live, f"candidate {n!r} has no live heap entry"
            seen_slots.append(n.value)
        assert count == self._num_nodes, f"node count {self._num_nodes} != {count} reachable"
        assert ev == self._evictable, f"evictable_size {self._evictable} != {ev} counted"
        assert pr == self._protected, f"protected_size {self._protected} != {pr} counted"
        if seen_slots:
            allslots = np.concatenate(seen_slots)
            assert np.unique(allslots).size == allslots.size, "a slot is held by two tree nodes"
        self.pins.check()
        if self.host is not None:
            self.host.check_invariants()
