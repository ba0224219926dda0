"""The radix tree's inspection, as functions of the tree (cache/radix/tree.py): a printout and
the structural check (structure, sizes, locks, heap entries of candidates, no slot held twice,
pins and the host tier)."""
from __future__ import annotations

from typing import Any

import numpy as np

from radixkv.cache.radix.node import TreeNode, is_candidate


def render(tree: Any, max_tokens: int = 6) -> str:
    """The tree as indented lines, one per node (its first tokens, length and lock), then the
    sizes."""
    lines: list[str] = []

    def walk(n: TreeNode, depth: int) -> None:
        for c in sorted(n.children.values(), key=lambda c: c.key.tokens[:1]):
            toks = c.key.tokens
            head = ", ".join(map(str, toks[:max_tokens])) + (", ..." if len(toks) > max_tokens else "")
            ns = "" if c.key.namespace == (None, None) else f" ns={c.key.namespace}"
            lines.append(f"{'  ' * depth}[{head}] len={len(toks)} lock={c.lock_ref}{ns}")
            walk(c, depth + 1)
    walk(tree.root, 0)
    lines.append(f"total={tree.total_size()} evictable={tree.evictable_size()} "
                 f"protected={tree.protected_size()} nodes={tree.num_nodes()}")
    return "\n".join(lines)


def check_tree(tree: Any) -> None:
    """Assert every structural invariant of `tree`; AssertionError names the first fault."""
    ps, ev, pr, count = tree.page_size, 0, 0, 0
    root = tree.root
    live = tree.evictor.live()
    seen_slots: list[np.ndarray] = []
    assert root.lock_ref >= 1, f"root lock_ref {root.lock_ref} < 1"
    for n in tree.nodes():
        count += 1
        for ck, c in n.children.items():
            assert c.parent is n, f"{c!r} has a wrong parent pointer"
            assert ck == tree.child_key(n, c.key, 0), f"{c!r} stored under a wrong child-key"
            assert c.lock_ref <= n.lock_ref, f"lock_ref {c.lock_ref} of {c!r} > parent's {n.lock_ref}"
            if n is not root:
                assert c.key.namespace == n.key.namespace, f"{c!r} mixes namespaces with its parent"
        if n is root:
            continue
        assert n.parent is not None
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
        if is_candidate(n):
            assert id(n) in live, f"candidate {n!r} has no live heap entry"
        seen_slots.append(n.value)
    assert count == tree.num_nodes(), f"node count {tree.num_nodes()} != {count} reachable"
    assert ev == tree.evictable_size(), f"evictable_size {tree.evictable_size()} != {ev} counted"
    assert pr == tree.protected_size(), f"protected_size {tree.protected_size()} != {pr} counted"
    if seen_slots:
        allslots = np.concatenate(seen_slots)
        assert np.unique(allslots).size == allslots.size, "a slot is held by two tree nodes"
    tree.pin_table.check()
    if tree.host is not None:
        tree.host.check_invariants()
