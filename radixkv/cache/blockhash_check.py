"""The block-hash cache's reports and checks: its KV events ("stored" ones hashing new content
as it comes), orphan and duplicate counts, the free queue in order, the page hashes a
subscriber would hold, an insert's full check (`_reject`) and `check_invariants`, which also
checks that the kept walk (cache/blockhash.py) is exactly what a walk from the root finds.
`BlockChecks` is a part of `BlockHashCache`, reading its columns and arrays."""
from __future__ import annotations

from itertools import compress, count
from operator import not_

import numpy as np

from radixkv.cache.blockhash_handles import TOKEN
from radixkv.cache.events import EventRun, KVEvent, chain_hash, chain_hashes, run_pages
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


class BlockChecks:
    def _store_events(self, key: RadixKey, positions: list[int], path: list[int],
                      pages: list[bytes]) -> None:
        """A "stored" EventRun per run of consecutive new blocks, in key order (vLLM's
        BlockStored: one per run of blocks). Content seen before kept its node and hash; new
        content is the key's last blocks, one chain hashed in one call."""
        ns, h, kb, rb = key.namespace, self._hash, key.buf, self._row.itemsize
        for a, z in _spans(positions):            # consecutive positions: a parent-child chain
            # a copy of known content kept its node and hash; the nodes this insert made (the
            # key's last blocks) are hashed here, in one call from the first without a hash
            j = next(compress(count(a), map(not_, map(h.__contains__, path[a:z]))), z)
            if j < z:
                got = chain_hashes(h.get(path[j - 1]) if j else None, (ns[0], None), pages[j:z],
                                   self.hash_algo, first=ns if j == 0 else None, memo=False)
                h.update(zip(path[j:z], got))
            hashes = got if j == a else list(map(h.__getitem__, path[a:z]))
            # a block's parent block is the one before it in the key (the first one's: none)
            self._events.append(EventRun("stored", hashes, h.get(path[a - 1]) if a else None,
                                         kb[a * rb:z * rb], ns))

    def _reject(self, ids: np.ndarray, held: np.ndarray, path: list[int]) -> None:
        """The insert's checks in full, in their order: raise naming the first fault."""
        ordered = np.sort(ids)
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(twice):
            raise ValueError(f"insert lists block {int(twice[0])} twice")
        want = np.full(len(ids), -1, np.int64)
        want[:len(path)] = path
        bad = (held >= 0) & (held != want)                    # a registered id, other content
        raise ValueError(f"block {int(ids[bad.argmax()])} is already registered with other content")

    def take_events(self) -> list[KVEvent]:
        return run_pages(self.take_event_runs())

    def take_event_runs(self) -> list[EventRun]:
        ev, self._events = self._events, []
        return ev

    def stats(self) -> dict[str, int]:
        return {"orphan_blocks": self.orphan_blocks(), "duplicate_blocks": self.duplicate_blocks}

    def orphan_blocks(self) -> int:
        """Cached blocks whose parent content has no cached copy: unreachable until it returns."""
        parents = (self._parent[n] for n in self._node[self._node >= 0].tolist())
        return sum(1 for p in parents if self._parent[p] >= 0 and self._first[p] < 0)

    def free_queue_ids(self) -> list[int]:
        return self._queue.ids().tolist()

    def _page_hashes(self) -> set[int]:
        # every cached block's content node has its hash (computed when it was stored)
        return {self._hash[n] for n in self._node[self._node >= 0].tolist()}

    def _walk_from_root(self, ns: tuple, pages: list[bytes]) -> list[int]:
        path, node = [], self._roots.get(ns)
        for page in pages if node is not None else ():
            kids = self._kids[node] if self._kids[node] is not None else {self._page[node + 1]: node + 1}
            node = kids.get(page)
            if node is None:
                break
            path.append(node)
        return path

    def check_invariants(self) -> None:
        # nodes: the live ones are the roots and their descendants, each filed under its page in
        # its parent, each with a cached copy or a child or waiting to be pruned; hashes (where computed) chain as
        # block_hashes chains them; dropped ids are free, each once
        live, stack, bare = [], [(r, -1, ns, ns) for ns, r in self._roots.items()], set(self._bare)
        while stack:
            n, parent, page, ns = stack.pop()                 # ns: what this block's hash mixes in
            assert (self._parent[n], self._page[n]) == (parent, page), f"node {n} is misfiled"
            kids = self._kids[n] if self._kids[n] is not None else {self._page[n + 1]: n + 1}
            assert self._first[n] >= 0 or kids or n in bare, f"node {n} has no copy and no child"
            assert self._nk[n] == len(kids), f"node {n} counts {self._nk[n]} children, has {len(kids)}"
            if parent >= 0 and (n in self._hash or self.enable_events):
                page = RadixKey(np.frombuffer(page, TOKEN)).page(0, self.block_size)
                want = chain_hash(self._hash.get(parent), ns, page, self.hash_algo)
                assert self._hash.get(n) == want, f"node {n}: hash {self._hash.get(n)} != {want}"
            live.append(n)
            inner = ns if parent < 0 else (ns[0], None)     # the salt enters the first block only
            stack.extend((k, n, pg, inner) for pg, k in kids.items())
        free = set(self._free_nodes)
        assert len(free) == len(self._free_nodes) and sorted(live + self._free_nodes) == \
            list(range(len(self._parent))), "node ids are not exactly live or free"
        assert all(self._page[n] is None for n in free) and set(self._hash) <= set(live), \
            "a dropped node kept its page or its hash"
        assert (self._first[list(free)] == -1).all(), "a dropped node kept a copy"
        assert all(self._first[r] == -1 for r in self._roots.values()), "a root holds a copy"
        # copies: every cached block is listed once, on its own node, with a serial of its own
        copies = [(b, n) for n in live for b in [int(self._first[n])] + self._dups.get(n, []) if b >= 0]
        assert all(self._first[n] >= 0 and v for n, v in self._dups.items()), "a stray copy list"
        cached = np.flatnonzero(self._node >= 0)
        assert sorted(b for b, _ in copies) == cached.tolist(), "copies != cached blocks"
        assert all(self._node[b] == n for b, n in copies), "a block listed under another node"
        assert ((self._serial > 0) == (self._node >= 0)).all(), "serial without a node, or none"
        assert len(set(self._serial[cached].tolist())) == len(cached), "a serial used twice"
        assert self._nblocks == len(cached), f"count {self._nblocks} != {len(cached)} cached"
        assert all(v.cached() for v in self._views.values()), "a view of an evicted block"
        # the kept walk, while it counts as current, is the walk a fresh lookup would make
        last, pages, path, drops, arr = self._walked
        assert len(pages) == len(last) // self.block_size, "the kept walk's pages are not its key's"
        assert arr.tolist() == path[:len(arr)], "the kept walk's array is not a prefix of its path"
        if drops == self._drops:
            want = self._walk_from_root(last.namespace, pages)
            assert path == want, f"the kept walk {path} != {want} walked afresh"
        # ref counts and the free queue: exactly the cached blocks at ref 0, each once
        assert (self._ref >= 0).all(), f"negative ref count at block {int(np.argmin(self._ref))}"
        off = self._node < 0
        assert not self._ref[off].any(), "an uncached block id has a ref count"
        self._queue.check(cached, cached[self._ref[cached] == 0], off)
        assert self.peak_blocks >= self._nblocks, "peak below the current count"
