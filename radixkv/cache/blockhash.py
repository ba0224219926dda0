"""BlockHashCache: vLLM-style automatic prefix caching behind the PrefixCache interface.

KV lives in fixed blocks of `block_size` tokens (= SlotPool pages). vLLM keys a full block by a
hash chained on its parent block's hash, its token ids and its extra key (cache_salt is mixed
into the first block only, so it salts the whole chain). Lookups walk the chain and stop at
the first missing block; they change no state.

Index. A chained hash names (namespace, every token up to the end of the block). This cache
keeps that identity exactly, without hashing, as a trie of block contents: a root per
namespace and a node per distinct content under its parent's, found among the parent's
children by the block's token ids as bytes (compared in full: nothing can collide). A node
lists the blocks cached with its content, oldest first (vLLM's hash -> blocks bucket: two or
more when identical content was computed twice; the oldest serves hits), and lives while it
has a block or a child, so an orphan (a block whose parent block was evicted) is found again
once the parent content returns, as under a hash chain. The chained hashes (`hash_algo`) are
computed by `chain_hash` for every stored block when events are on (they are the events'
identity), and on first use otherwise (`Block.hash`, `by_hash`, `block_hashes`).

Block states (the free queue of vLLM split in two):
  unhashed, unused    -> the SlotPool (vLLM puts these at the head of the free queue)
  cached, ref_cnt > 0 -> here, protected (a running request uses it)
  cached, ref_cnt = 0 -> here, in the LRU free queue; evict() pops its head and drops the block
Allocation takes the SlotPool first and evicts only when it is empty, which is exactly vLLM's
order. A request's blocks return to the tail in reverse order (last block first), so leaves
are evicted before their parents. No dedup on insert: identical content computed twice is
cached twice (`duplicate_blocks` counts it).

Layout. No Python object per block: a million cached blocks would be millions of objects for
every full garbage collection to walk. Per block id: numpy arrays, so a chain is checked,
locked or unlocked in a few vectorised operations. Per node: lists of ints, bytes and
{bytes: int} dicts (none tracked by the collector), read one entry at a time while walking.
A handle is a `Chain` of block ids and registration serials; `Block`s are made when read.
"""
from __future__ import annotations

import itertools
from typing import Iterable

import numpy as np

from radixkv.cache.base import InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.blockhash_handles import TOKEN as _TOKEN
from radixkv.cache.blockhash_handles import Block, BlockViews, Chain
from radixkv.cache.events import KVEvent, chain_hash, check_hash_algo
from radixkv.cache.free_queue import FreeQueue
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS

_versions = itertools.count(1)          # match stamps, unique across caches and resets


class BlockHashCache(BlockViews, PrefixCache):
    name = "blockhash"

    def __init__(self, block_size: int = 16, hash_algo: str = "sha256", enable_events: bool = False):
        super().__init__(block_size, "block_size")
        self.block_size = block_size
        self.hash_algo, self.enable_events = check_hash_algo(hash_algo), enable_events
        self._row = np.dtype((np.void, block_size * _TOKEN.itemsize))   # one block of key.numpy()
        self._events: list[KVEvent] = []
        # per block id, grown on demand and never shrunk (a handle's ids always index them)
        self._node = np.full(1024, -1, np.int64)      # its content node; -1: not cached
        self._serial = np.zeros(1024, np.int64)       # its registration; 0: not cached
        self._ref = np.zeros(1024, np.int32)          # reference count
        self._queue = FreeQueue(1024)                  # its free-queue entry (cache/free_queue.py)
        self._serials = itertools.count(1)            # never reset: old handles stay stale
        self._drops = 0                               # bumped whenever blocks leave
        self.reset()
        self._events.clear()                          # "cleared" is for an explicit reset() only

    def reset(self) -> None:
        for a, v in ((self._node, -1), (self._serial, 0), (self._ref, 0)):
            a.fill(v)
        self._queue.reset()
        # per content node (ids of dropped nodes are reused)
        self._parent: list[int] = []          # parent node; -1 for a root
        self._page: list = []                 # block's token ids as bytes; root: its namespace
        self._kids: list[dict | None] = []    # page -> child; None: the one child is n + 1
        self._first: list[int] = []           # oldest cached copy (block id), -1 if none
        self._dups: dict[int, list[int]] = {}     # node -> its later copies, oldest first
        self._hash: dict[int, int] = {}           # node -> chained hash, once computed
        self._free_nodes: list[int] = []          # dropped ids (their page is None)
        self._roots: dict[tuple, int] = {}        # namespace -> root node
        self._views: dict[int, Block] = {}        # block id -> its Block, once one was read
        self._nblocks = self.duplicate_blocks = self.peak_blocks = 0
        self._walked: tuple = (RadixKey(), [], [], -1)      # last walk: key, pages, path, drops
        self._version = next(_versions)                     # changes whenever a match could
        self._drops += 1
        if self.enable_events:
            self._events.append(KVEvent("cleared"))

    # ---- lookup ---------------------------------------------------------------------------
    def _walk(self, key: RadixKey) -> tuple[list[bytes], list[int]]:
        """`key`'s pages (its full blocks: key.numpy() cut into rows of block_size ids, each row
        one bytes value, equal exactly when the ids are) and the trie nodes along them as far
        as they exist (through nodes with no cached copy). Both resume the previous walk over
        the whole blocks `key` shares with it (a request's match and inserts walk one prefix);
        nodes leave the trie only when blocks are dropped."""
        bs, (last, pages, path, drops) = self.block_size, self._walked
        m, toks = key.shared(last) // bs, key.numpy()
        pages = pages[:m] + toks[m * bs:len(toks) - len(toks) % bs].view(self._row).tolist()
        path = path[:m] if drops == self._drops and last.namespace == key.namespace else []
        node = path[-1] if path else self._roots.get(key.namespace)
        if node is not None:
            kids, pg = self._kids, self._page
            for page in itertools.islice(pages, len(path), None):
                k = kids[node]
                node = k.get(page) if k is not None else node + 1 if pg[node + 1] == page else None
                if node is None:
                    break
                path.append(node)
        self._walked = (key, pages, path, self._drops)
        return pages, path

    def _match(self, key: RadixKey, split: bool) -> MatchResult:
        """Hit blocks of `key`, up to the first block with no cached copy. Changes nothing but
        the walk memo."""
        heads = list(map(self._first.__getitem__, self._walk(key)[1]))
        if -1 in heads:
            del heads[heads.index(-1):]
        ids = np.array(heads, np.int64)
        return MatchResult(len(ids) * self.block_size, self._slots(ids), self._chain(ids))

    def lookup(self, prompt: RadixKey) -> MatchResult:
        """vLLM's get_computed_blocks: the last prompt token is always recomputed, so a full
        hit is capped at len - 1 and then rounded down to a whole block."""
        prompt = as_key(prompt)
        return self.match_prefix(prompt[:max(len(prompt) - 1, 0)])

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        if not len(ids):
            return EMPTY_SLOTS
        return (ids[:, None] * self.block_size + np.arange(self.block_size)).ravel()

    def _chain(self, ids: np.ndarray) -> Chain:
        return Chain(self, ids, self._serial[ids], self._drops)

    def locks_held(self) -> int:
        return int(self._ref.sum())               # one reference per block of a locked chain

    def lock_units(self, chain) -> int:
        return len(chain) if chain is not None else 0

    def lock_cost(self, key: RadixKey, chain, prefix_len: int) -> int:
        # the hit blocks at ref 0 sit in the free queue (evictable) until locked
        return int((self._ref[chain.ids] == 0).sum()) * self.block_size if len(chain) else 0

    def match_stamp(self, chain) -> int:
        return self._version

    def match_valid(self, chain, stamp) -> bool:
        # a match reads only which blocks are cached (not ref counts or queue order): it can
        # change only when an insert registers a block, an eviction drops one, or a reset
        return stamp == self._version

    # ---- insert (vLLM's cache_full_blocks) ------------------------------------------------
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag=None
                ) -> InsertResult:
        """Register the full blocks of `key`; `slots` must be whole blocks of the pool. A block
        id already registered with this content counts as cached (prefix_len, up to the first
        new block); a new block whose content another block already has is registered too (a
        duplicate, as in vLLM). New blocks are unreferenced: they join the free queue's tail,
        last block first."""
        bs = self.block_size
        nfull = len(key) // bs
        ids = slots[:nfull * bs:bs] // bs
        if not (slots[:nfull * bs] == self._slots(ids)).all():
            raise ValueError(f"slots are not whole blocks of {bs} (first: {slots[:bs].tolist()})")
        ordered = np.sort(ids)
        twice = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(twice):
            raise ValueError(f"insert lists block {int(twice[0])} twice")
        self._grow(int(ordered[-1]) if nfull else 0)
        pages, path = self._walk(key)                         # the nodes key already has
        held, want = self._node[ids], np.full(nfull, -1, np.int64)
        want[:len(path)] = path
        bad = (held >= 0) & (held != want)                    # a registered id, other content
        if bad.any():
            raise ValueError(f"block {int(ids[bad.argmax()])} is already registered with other content")
        new = np.flatnonzero(held < 0)
        if len(new):
            known, nodes = len(path), []
            for i in new[new < known].tolist():               # known content: one more copy
                n, bid = path[i], int(ids[i])
                if self._first[n] < 0:
                    self._first[n] = bid
                else:
                    self._dups.setdefault(n, []).append(bid)
                    self.duplicate_blocks += 1
                nodes.append(n)
            if known < nfull:                                 # new content: a chain of new nodes
                parent = path[-1] if path else self._root(key.namespace)
                made = self._add_nodes(parent, pages[known:], ids[known:].tolist())
                path += made                                  # extends the walk memo too
                nodes += made
            added = ids[new]
            self._node[added] = nodes
            self._serial[added] = np.fromiter(self._serials, np.int64, len(added))
            if self.enable_events:
                self._store_events(key, new.tolist(), path)
            self._queue.push(added[::-1])
            self._nblocks += len(added)
            self._version = next(_versions)
            self.peak_blocks = max(self.peak_blocks, self._nblocks)
        prefix = int(new[0]) if len(new) else nfull
        return InsertResult(prefix * bs, self._chain(ids))

    def _root(self, ns: tuple) -> int:
        if ns not in self._roots:
            self._roots[ns] = self._add_nodes(-1, [ns], [-1])[0]
        return self._roots[ns]

    def _add_nodes(self, parent: int, pages: list, firsts: list[int]) -> list[int]:
        """New nodes, one per page, each the next one's parent, the first under `parent` (-1:
        a root, whose page is its namespace); firsts: their first copies. Dropped ids are
        reused first; fresh ones are appended to the columns in bulk."""
        k, free = len(pages), self._free_nodes
        reused = [free.pop() for _ in range(min(k, len(free)))]
        made = reused + list(range(len(self._parent), len(self._parent) + k - len(reused)))
        parents = [parent] + made[:-1]
        # a run of consecutive ids needs no dict: a node's only child is the next id
        kids = [None if n == p + 1 else {g: n} for p, n, g in zip(made, made[1:], pages[1:])] + [{}]
        if parent >= 0:
            if self._kids[parent] is None:                    # a second child: spell out the first
                self._kids[parent] = {self._page[parent + 1]: parent + 1}
            self._kids[parent][pages[0]] = made[0]
        for n, p, g, d, f in zip(reused, parents, pages, kids, firsts):
            self._parent[n], self._page[n], self._kids[n], self._first[n] = p, g, d, f
        for column, values in ((self._parent, parents), (self._page, pages), (self._kids, kids),
                               (self._first, firsts)):
            column += values[len(reused):]
        return made

    def _store_events(self, key: RadixKey, positions: list[int], path: list[int]) -> None:
        """A "stored" event per new block, in key order, hashing new content as it comes."""
        bs, ns, h = self.block_size, key.namespace, self._hash
        rows = key.numpy()[:len(key) // bs * bs].reshape(-1, bs)[positions].tolist()
        for i, toks in zip(positions, rows):
            n, parent = path[i], self._parent[path[i]]
            if n not in h:
                h[n] = chain_hash(h.get(parent), ns if i == 0 else (ns[0], None), key.page(i, bs),
                                  self.hash_algo)
            self._events.append(KVEvent("stored", h[n], h.get(parent), tuple(toks), ns))

    def _grow(self, max_id: int) -> None:
        """Make the per-block-id arrays cover `max_id`."""
        n = len(self._ref)
        if max_id >= n:
            extra = max(n, max_id + 1 - n)
            self._node, self._serial, self._ref = (
                np.concatenate([a, np.full(extra, v, a.dtype)]) for a, v in
                ((self._node, -1), (self._serial, 0), (self._ref, 0)))
            self._queue.grow(n + extra)

    # ---- eviction: the free queue's head ------------------------------------------------------
    def _evict(self, num_tokens: int) -> np.ndarray:
        victims = self._queue.pop(-(-num_tokens // self.block_size))
        if not len(victims):
            return EMPTY_SLOTS
        for bid, n in zip(victims.tolist(), self._node[victims].tolist()):
            more = self._dups.get(n)
            if self._first[n] == bid:
                self._first[n] = more.pop(0) if more else -1
            else:
                more.remove(bid)
            if more == []:
                del self._dups[n]
            if self.enable_events:
                self._events.append(KVEvent("removed", self._hash[n]))
            self._views.pop(bid, None)
            while self._first[n] < 0 and self._kids[n] == {}:  # drop content nothing refers to
                parent, page = self._parent[n], self._page[n]
                if parent < 0:
                    del self._roots[page]
                elif self._kids[parent] is None:              # it was the run's next id
                    self._kids[parent] = {}
                else:
                    del self._kids[parent][page]
                self._kids[n] = self._page[n] = None
                self._hash.pop(n, None)
                self._free_nodes.append(n)
                if parent < 0:
                    break
                n = parent
        self._node[victims], self._serial[victims] = -1, 0
        self._nblocks -= len(victims)
        self._version, self._drops = next(_versions), self._drops + 1
        return self._slots(victims)

    # ---- reference counts -----------------------------------------------------------------
    def _runs(self, chain) -> list[np.ndarray]:
        """The id arrays a checked handle is locked or unlocked in, in order: a Chain's blocks
        are distinct, one vectorised step; a hand-made tuple may list a block twice, so it
        goes one block at a time, exactly as listed."""
        if isinstance(chain, Chain):
            return [chain.ids]
        return [np.array([b.id], np.int64) for b in chain or ()]

    def _inc_lock(self, chain) -> None:
        for ids in self._runs(chain):
            ref = self._ref[ids]
            leaving = ids[ref == 0]                           # their queue entries go stale
            self._queue.remove(leaving)
            self._ref[ids] = ref + 1

    def _check_locked(self, chain) -> None:
        if isinstance(chain, Chain) and (self._ref[chain.ids] > 0).all():
            return
        seen: dict[int, int] = {}
        for b in chain or ():                                 # a block listed k times needs k refs
            seen[b.id] = seen.get(b.id, 0) + 1
            if self._ref[b.id] < seen[b.id]:
                raise ValueError(f"dec_lock_ref on unreferenced {b!r}")

    def _dec_lock(self, chain) -> None:
        for ids in reversed(self._runs(chain)):
            rev = ids[::-1]                                   # last block reaches the tail first
            self._ref[rev] -= 1
            self._queue.push(rev[self._ref[rev] == 0])

    def _check_handle(self, chain) -> None:
        if chain is None:
            return
        ours = isinstance(chain, Chain) and chain.cache is self
        if ours and chain.drops == self._drops:
            return                                            # nothing dropped since: all cached
        if isinstance(chain, Chain):
            ids, serials = chain.ids, chain.serials
        elif isinstance(chain, tuple) and all(isinstance(b, Block) for b in chain):
            ids = np.fromiter((b.id for b in chain), np.int64, len(chain))
            serials = np.fromiter((b.serial for b in chain), np.int64, len(chain))
            ours = all(b.cache is self for b in chain)
        else:
            raise TypeError(f"expected a Chain or a tuple of Blocks from match_prefix, got {chain!r}")
        if len(ids) and (not ours or not (ids < len(self._serial)).all()
                         or (self._serial[ids] != serials).any()):
            bad = next(b for b in chain if b.cache is not self or not b.cached())
            raise ValueError(f"{bad!r} is no longer cached (evicted or foreign)")
        if isinstance(chain, Chain):
            chain.drops = self._drops

    # ---- sizes and stats ------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._queue.n * self.block_size

    def protected_size(self) -> int:
        return (self._nblocks - self._queue.n) * self.block_size

    def num_blocks(self) -> int:
        return self._nblocks

    num_entries = num_blocks

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str,
                 evict_granularity: str = "node") -> str:
        return f"{cls.name} b{page_size} {hash_algo}"         # evicts in LRU order only

    @property
    def label(self) -> str:
        return self.describe(self.block_size, "lru", self.hash_algo)

    def stats(self) -> dict[str, int]:
        return {"orphan_blocks": self.orphan_blocks(), "duplicate_blocks": self.duplicate_blocks}

    def orphan_blocks(self) -> int:
        """Cached blocks whose parent content has no cached copy: unreachable until it returns."""
        parents = (self._parent[n] for n in self._node[self._node >= 0].tolist())
        return sum(1 for p in parents if self._parent[p] >= 0 and self._first[p] < 0)

    def free_queue_ids(self) -> list[int]:
        return self._queue.ids().tolist()

    def held_slots(self) -> Iterable[np.ndarray]:
        return [self._slots(np.flatnonzero(self._node >= 0))]

    def take_events(self) -> list[KVEvent]:
        ev, self._events = self._events, []
        return ev

    def _page_hashes(self) -> set[int]:
        # every cached block's content node has its hash (computed when it was stored)
        return {self._hash[n] for n in self._node[self._node >= 0].tolist()}

    def check_invariants(self) -> None:
        # nodes: the live ones are the roots and their descendants, each filed under its page in
        # its parent, each with a cached copy or a child; hashes (where computed) chain as
        # block_hashes chains them; dropped ids are free, each once
        live, stack = [], [(r, -1, ns, ns) for ns, r in self._roots.items()]
        while stack:
            n, parent, page, ns = stack.pop()                 # ns: what this block's hash mixes in
            assert (self._parent[n], self._page[n]) == (parent, page), f"node {n} is misfiled"
            kids = self._kids[n] if self._kids[n] is not None else {self._page[n + 1]: n + 1}
            assert self._first[n] >= 0 or kids, f"node {n} has no copy and no child"
            if parent >= 0 and (n in self._hash or self.enable_events):
                page = RadixKey(np.frombuffer(page, _TOKEN)).page(0, self.block_size)
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
        assert all(self._first[r] == -1 for r in self._roots.values()), "a root holds a copy"
        # copies: every cached block is listed once, on its own node, with a serial of its own
        copies = [(b, n) for n in live for b in [self._first[n]] + self._dups.get(n, []) if b >= 0]
        assert all(self._first[n] >= 0 and v for n, v in self._dups.items()), "a stray copy list"
        cached = np.flatnonzero(self._node >= 0)
        assert sorted(b for b, _ in copies) == cached.tolist(), "copies != cached blocks"
        assert all(self._node[b] == n for b, n in copies), "a block listed under another node"
        assert ((self._serial > 0) == (self._node >= 0)).all(), "serial without a node, or none"
        assert len(set(self._serial[cached].tolist())) == len(cached), "a serial used twice"
        assert self._nblocks == len(cached), f"count {self._nblocks} != {len(cached)} cached"
        assert all(v.cached() for v in self._views.values()), "a view of an evicted block"
        # ref counts and the free queue: exactly the cached blocks at ref 0, each once
        assert (self._ref >= 0).all(), f"negative ref count at block {int(np.argmin(self._ref))}"
        off = self._node < 0
        assert not self._ref[off].any(), "an uncached block id has a ref count"
        self._queue.check(cached, cached[self._ref[cached] == 0], off)
        assert self.peak_blocks >= self._nblocks, "peak below the current count"
