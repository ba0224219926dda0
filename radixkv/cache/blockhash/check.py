"""The block-hash cache's reports and checks, as functions of the cache
(cache/blockhash/cache.py): its "stored" KV events (hashing new content as it comes), the
orphan count, the page hashes a subscriber would hold, an insert's full check (`reject`) and
the structural check, which also checks that the kept walk is exactly what a walk from the
root finds."""
from __future__ import annotations

from itertools import compress, count
from operator import not_

import numpy as np

from typing import Any

from radixkv.cache.blockhash.handles import TOKEN
from radixkv.cache.events import EventRun, chain_hash, chain_hashes
from radixkv.cache.key import RadixKey


def _spans(positions: list[int]) -> list[tuple[int, int]]:
    """Ascending positions cut into runs of consecutive ones, each as (first, last + 1)."""
    if not positions:
        return []
    if positions[-1] - positions[0] == len(positions) - 1:
        return [(positions[0], positions[-1] + 1)]
    spans, start = [], positions[0]
    for prev, i in zip(positions, positions[1:]):
        if i != prev + 1:
            spans.append((start, prev + 1))
            start = i
    spans.append((start, positions[-1] + 1))
    return spans


def store_events(cache: Any, key: RadixKey, positions: list[int], path: list[int],
                  pages: list[bytes]) -> None:
    """A "stored" EventRun per run of consecutive new blocks, in key order (vLLM's
    BlockStored: one per run of blocks). Content seen before kept its node and hash; new
    content is the key's last blocks, one chain hashed in one call."""
    ns, h, kb, rb = key.namespace, cache._hash, key.buf, cache._row.itemsize
    for a, z in _spans(positions):            # consecutive positions: a parent-child chain
        # a copy of known content kept its node and hash; the nodes this insert made (the
        # key's last blocks) are hashed here, in one call from the first without a hash
        j = next(compress(count(a), map(not_, map(h.__contains__, path[a:z]))), z)
        if j < z:
            got = chain_hashes(h.get(path[j - 1]) if j else None, (ns[0], None), pages[j:z],
                               cache.hash_algo, first=ns if j == 0 else None, memo=False)
            h.update(zip(path[j:z], got))
        hashes = got if j == a else list(map(h.__getitem__, path[a:z]))
        # a block's parent block is the one before it in the key (the first one's: none)
        cache.log.record(EventRun("stored", hashes, h.get(path[a - 1]) if a else None,
                                     kb[a * rb:z * rb], ns))


def reject(ids: np.ndarray, held: np.ndarray, path: list[int]) -> None:
    """The insert's checks in full, in their order: raise naming the first fault."""
    ordered = np.sort(ids)
    twice = ordered[1:][ordered[1:] == ordered[:-1]]
    if len(twice):
        raise ValueError(f"insert lists block {int(twice[0])} twice")
    want = np.full(len(ids), -1, np.int64)
    want[:len(path)] = path
    bad = (held >= 0) & (held != want)                    # a registered id, other content
    raise ValueError(f"block {int(ids[bad.argmax()])} is already registered with other content")


def orphan_blocks(cache: Any) -> int:
    """Cached blocks whose parent content has no cached copy: unreachable until it returns."""
    parents = (cache._parent[n] for n in cache._node[cache._node >= 0].tolist())
    return sum(1 for p in parents if cache._parent[p] >= 0 and cache._first[p] < 0)


def page_hashes(cache: Any) -> set[int]:
    # every cached block's content node has its hash (computed when it was stored)
    return {cache._hash[n] for n in cache._node[cache._node >= 0].tolist()}


def walk_from_root(cache: Any, ns: tuple, pages: list[bytes]) -> list[int]:
    path, node = [], cache._roots.get(ns)
    for page in pages if node is not None else ():
        kids = cache._kids[node] if cache._kids[node] is not None else {cache._page[node + 1]: node + 1}
        node = kids.get(page)
        if node is None:
            break
        path.append(node)
    return path


def check_blockhash(cache: Any) -> None:
    """Assert every structural invariant of the cache; AssertionError names the first fault."""
    # nodes: the live ones are the roots and their descendants, each filed under its page in
    # its parent, each with a cached copy or a child or waiting to be pruned; hashes (where computed) chain as
    # block_hashes chains them; dropped ids are free, each once
    live, stack, bare = [], [(r, -1, ns, ns) for ns, r in cache._roots.items()], set(cache._bare)
    while stack:
        n, parent, page, ns = stack.pop()                 # ns: what this block's hash mixes in
        assert (cache._parent[n], cache._page[n]) == (parent, page), f"node {n} is misfiled"
        kids = cache._kids[n] if cache._kids[n] is not None else {cache._page[n + 1]: n + 1}
        assert cache._first[n] >= 0 or kids or n in bare, f"node {n} has no copy and no child"
        assert cache._nk[n] == len(kids), f"node {n} counts {cache._nk[n]} children, has {len(kids)}"
        if parent >= 0 and (n in cache._hash or cache.enable_events):
            page = RadixKey(np.frombuffer(page, TOKEN)).page(0, cache.block_size)
            want = chain_hash(cache._hash.get(parent), ns, page, cache.hash_algo)
            assert cache._hash.get(n) == want, f"node {n}: hash {cache._hash.get(n)} != {want}"
        live.append(n)
        inner = ns if parent < 0 else (ns[0], None)     # the salt enters the first block only
        stack.extend((k, n, pg, inner) for pg, k in kids.items())
    free = set(cache._free_nodes)
    assert len(free) == len(cache._free_nodes) and sorted(live + cache._free_nodes) == \
        list(range(len(cache._parent))), "node ids are not exactly live or free"
    assert all(cache._page[n] is None for n in free) and set(cache._hash) <= set(live), \
        "a dropped node kept its page or its hash"
    assert (cache._first[list(free)] == -1).all(), "a dropped node kept a copy"
    assert all(cache._first[r] == -1 for r in cache._roots.values()), "a root holds a copy"
    # copies: every cached block is listed once, on its own node, with a serial of its own
    copies = [(b, n) for n in live for b in [int(cache._first[n])] + cache._dups.get(n, []) if b >= 0]
    assert all(cache._first[n] >= 0 and v for n, v in cache._dups.items()), "a stray copy list"
    cached = np.flatnonzero(cache._node >= 0)
    assert sorted(b for b, _ in copies) == cached.tolist(), "copies != cached blocks"
    assert all(cache._node[b] == n for b, n in copies), "a block listed under another node"
    assert ((cache._serial > 0) == (cache._node >= 0)).all(), "serial without a node, or none"
    assert len(set(cache._serial[cached].tolist())) == len(cached), "a serial used twice"
    assert cache._nblocks == len(cached), f"count {cache._nblocks} != {len(cached)} cached"
    assert all(v.cached() for v in cache.views.memo.values()), "a view of an evicted block"
    # the kept walk, while it counts as current, is the walk a fresh lookup would make
    last, pages, path, drops, arr = cache._walked
    assert len(pages) == len(last) // cache.block_size, "the kept walk's pages are not its key's"
    assert arr.tolist() == path[:len(arr)], "the kept walk's array is not a prefix of its path"
    if drops == cache._drops:
        fresh = walk_from_root(cache, last.namespace, pages)
        assert path == fresh, f"the kept walk {path} != {fresh} walked afresh"
    # ref counts and the free queue: exactly the cached blocks at ref 0, each once
    cache.refs.check(cached, cache._node < 0)
    assert cache.peak_blocks >= cache._nblocks, "peak below the current count"
