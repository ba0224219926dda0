"""The block-hash cache's content trie (cache/blockhash/cache.py: a root per namespace, a node
per distinct block content under its parent's): growing it by a chain of new nodes and pruning
the bare ones, as functions of the cache's node columns."""
from __future__ import annotations

from typing import Any

import numpy as np


def add_nodes(cache: Any, parent: int, pages: list, firsts) -> tuple[list[int], np.ndarray]:
    """New nodes, one per page, each the next one's parent, the first under `parent` (-1:
    a root, whose page is its namespace); firsts: their first copies. Dropped ids are
    reused first; fresh ones are appended to the columns in bulk. Returns the ids as a
    list and as an int64 array."""
    k, free, top = len(pages), cache._free_nodes, len(cache._parent)
    if free:
        reused = free[:-min(k, len(free)) - 1:-1]
        del free[len(free) - len(reused):]
    else:
        reused = []
    made = reused + list(range(top, top + k - len(reused)))
    parents = [parent] + made[:-1]
    # a run of consecutive ids needs no dict: a node's only child is the next id
    if reused:
        kids = [None if n == p + 1 else {g: n} for p, n, g in zip(made, made[1:], pages[1:])]
        kids.append({})
    else:
        kids = [None] * (k - 1) + [{}]
    if parent >= 0:
        if cache._kids[parent] is None:                    # a second child: spell out the first
            cache._kids[parent] = {cache._page[parent + 1]: parent + 1}
        cache._kids[parent][pages[0]] = made[0]
        cache._nk[parent] += 1
    for n, p, g, d in zip(reused, parents, pages, kids):
        cache._parent[n], cache._page[n], cache._kids[n] = p, g, d
    r = len(reused)
    cache._parent += parents[r:]
    cache._page += pages[r:]
    cache._kids += kids[r:]
    if len(cache._parent) > len(cache._first):             # node columns: double as needed
        extra = max(len(cache._first), len(cache._parent) - len(cache._first))
        cache._first = np.concatenate([cache._first, np.full(extra, -1, np.int64)])
        cache._nk = np.concatenate([cache._nk, np.zeros(extra, np.int32)])
    ma = np.array(made, np.int64) if r else np.arange(top, top + k)
    at = ma if r else slice(top, top + k)                # fresh ids: one slice
    cache._first[at] = firsts
    cache._nk[at] = 1
    cache._nk[made[-1]] = 0
    return made, ma


def prune(cache: Any) -> None:
    """Drop the bare nodes (no cached copy, no child) and the parents that leaves bare.
    Evictions only list them: content evicted and computed again (a conversation's next
    turn) finds its node still there, so neither is dropped and made again per block."""
    first, nk, kids, pg, parents = cache._first, cache._nk, cache._kids, cache._page, cache._parent
    hashes, free = cache._hash, cache._free_nodes
    for n in cache._bare:
        while pg[n] is not None and first[n] < 0 and nk[n] == 0:
            parent, page = parents[n], pg[n]
            if parent < 0:
                del cache._roots[page]
            elif kids[parent] is None:                    # it was the run's next id
                kids[parent] = {}
            else:
                del kids[parent][page]
            if parent >= 0:
                nk[parent] -= 1
            kids[n] = pg[n] = None
            if hashes:
                hashes.pop(n, None)
            free.append(n)
            if parent < 0:
                break
            n = parent
    cache._bare = []
    last, pages, path, drops, arr = cache._walked
    j = len(path)                             # a dropped node has no child: the dropped
    while j and pg[path[j - 1]] is None:      # nodes of a path are its last ones
        j -= 1
    cache._walked = (last, pages, path[:j], drops, arr[:j])
