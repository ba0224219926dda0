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
has a block or a child (or, bare, until the next pruning), so an orphan (a block whose parent
block was evicted) is found again once the parent content returns, as under a hash chain. The
chained hashes (`hash_algo`) are computed by `chain_hash` for every stored block when events
are on (they are the events' identity), and on first use otherwise (`Block.hash`, `by_hash`,
`block_hashes`).

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
{bytes: int} dicts (none tracked by the collector), read one entry at a time while walking,
and two arrays (first copy, child count) that a path's or an eviction's nodes read at once.
A handle is a `Chain` of block ids and registration serials; `Block`s are made when read.

Walks. A request's match and inserts walk one prefix, so the last walk (its pages and trie
path, and the path as an int64 array, converted only where the list grew) is kept and
resumed. Evicting a block leaves its node in place (bare, when it has no child either); bare
nodes are dropped in batches, once there are more of them than cached blocks, so content
evicted and computed again finds its node. Only that pruning removes nodes, and it cuts the
kept path's dropped tail (a dropped node has no child, so the dropped nodes of a path are its
last ones). Collaborators that own their state: reference counts and the free queue (refs.py,
free_queue.py), the Block memo and hash views (handles.py), the KV events (an EventLog);
the events' hashing, an insert's full check and the structural check are functions in
check.py.
"""
from __future__ import annotations

import itertools
from typing import Iterable

import numpy as np

from radixkv.cache.abilities import EventLog
from radixkv.cache.base import InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.blockhash.check import (check_blockhash, orphan_blocks, page_hashes, reject,
                                           store_events)
from radixkv.cache.blockhash.handles import TOKEN as _TOKEN
from radixkv.cache.blockhash.handles import Block, BlockViews, Chain, check_handle
from radixkv.cache.blockhash.refs import RefCounts
from radixkv.cache.blockhash.trie import add_nodes, prune
from radixkv.cache.events import EventRun, check_hash_algo
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS, page_slots

_versions = itertools.count(1)          # match stamps, unique across caches and resets
_NO_IDS = np.zeros(0, np.int64)
_PRUNE_AT = 1024                        # bare nodes kept at least, and up to one per cached block
_PRUNE_SHARE = 1


class BlockHashCache(PrefixCache[Chain]):
    name = "blockhash"

    def __init__(self, block_size: int = 16, hash_algo: str = "sha256", enable_events: bool = False):
        super().__init__(block_size, "block_size")
        self.block_size = block_size
        self.hash_algo, self.enable_events = check_hash_algo(hash_algo), enable_events
        self._row = np.dtype((np.void, block_size * _TOKEN.itemsize))   # one block of key.buf
        self.log = EventLog(lambda: page_hashes(self))   # one record per run stored or evicted
        self.views = BlockViews(self)
        # per block id, grown on demand and never shrunk (a handle's ids always index them)
        self._node = np.full(1024, -1, np.int64)      # its content node; -1: not cached
        self._serial = np.zeros(1024, np.int64)       # its registration; 0: not cached
        self.refs = RefCounts(1024)                   # reference counts and the free queue
        self._next_serial = 1                         # never reset: old handles stay stale
        self._drops = 0                               # bumped whenever blocks leave
        self.reset()
        self.log.clear()                              # "cleared" is for an explicit reset() only

    def reset(self) -> None:
        self._node.fill(-1)
        self._serial.fill(0)
        self.refs.reset()
        # per content node (ids of dropped nodes are reused)
        self._parent: list[int] = []          # parent node; -1 for a root
        self._page: list = []                 # block's token ids as bytes; root: its namespace
        self._kids: list[dict | None] = []    # page -> child; None: the one child is n + 1
        self._first = np.full(1024, -1, np.int64)  # oldest cached copy (block id), -1 if none
        self._nk = np.zeros(1024, np.int32)        # children (both arrays: capacity, not count)
        self._dups: dict[int, list[int]] = {}     # node -> its later copies, oldest first
        self._hash: dict[int, int] = {}           # node -> chained hash, once computed
        self._free_nodes: list[int] = []          # dropped ids (their page is None)
        self._bare: list[int] = []                # nodes left with no copy and no child
        self._roots: dict[tuple, int] = {}        # namespace -> root node
        self.views.memo.clear()
        self._nblocks = self.duplicate_blocks = self.peak_blocks = 0
        # last walk: key, pages, path, drops, and a prefix of path as an int64 array
        self._walked: tuple = (RadixKey(), [], [], -1, _NO_IDS)
        self._version = next(_versions)                     # changes whenever a match could
        self._drops += 1
        if self.enable_events:
            self.log.record(EventRun("cleared", []))

    # ---- lookup ---------------------------------------------------------------------------
    def _walk(self, key: RadixKey) -> tuple[list[bytes], list[int]]:
        """`key`'s pages (its full blocks: rows of block_size packed ids, each one bytes value,
        equal exactly when the ids are) and the trie nodes along them as far as they exist
        (through nodes with no cached copy). Both resume the previous walk over the whole
        blocks `key` shares with it (a request's match and inserts walk one prefix); nodes
        leave the trie only when bare ones are pruned, and _prune trims the kept path then."""
        bs, (last, pages, path, drops, arr) = self.block_size, self._walked
        row, kb = self._row, key.buf
        m = (len(last) if kb.startswith(last.buf) else key.shared(last)) // bs   # no copy: a prefix
        whole = len(kb) // row.itemsize
        pages = pages[:m] + np.frombuffer(kb, row, whole - m, m * row.itemsize).tolist()
        kept = drops == self._drops and last.namespace == key.namespace
        path, arr = (path[:m], arr[:m]) if kept else ([], _NO_IDS)
        node = path[-1] if path else self._roots.get(key.namespace)
        if node is not None and len(path) < len(pages):
            kids, pg, append = self._kids, self._page, path.append
            for page in itertools.islice(pages, len(path), None):
                k = kids[node]
                if k is not None:
                    node = k.get(page)
                    if node is None:
                        break
                elif pg[node + 1] == page:
                    node += 1
                else:
                    break
                append(node)
        self._walked = (key, pages, path, self._drops, arr)
        return pages, path

    def _path_ids(self) -> np.ndarray:
        """The kept walk's path as an int64 array; only nodes the array lacks are converted."""
        last, pages, path, drops, arr = self._walked
        if len(arr) < len(path):
            tail = np.fromiter(itertools.islice(path, len(arr), None), np.int64,
                               len(path) - len(arr))
            arr = np.concatenate([arr, tail]) if len(arr) else tail
            self._walked = (last, pages, path, drops, arr)
        return arr

    def _match(self, key: RadixKey, split: bool) -> MatchResult[Chain]:
        """Hit blocks of `key`, up to the first block with no cached copy. Changes nothing but
        the walk memo."""
        if not self._walk(key)[1]:
            return MatchResult(0, EMPTY_SLOTS, self._chain(_NO_IDS))
        ids = self._first[self._path_ids()]
        gone = ids < 0
        if gone.any():
            ids = ids[:gone.argmax()]
        return MatchResult(len(ids) * self.block_size, self._slots(ids), self._chain(ids))

    def lookup(self, prompt: RadixKey) -> MatchResult:
        """vLLM's get_computed_blocks: the last prompt token is always recomputed, so a full
        hit is capped at len - 1 and then rounded down to a whole block."""
        prompt = as_key(prompt)
        return self.match_prefix(prompt[:max(len(prompt) - 1, 0)])

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        if not len(ids):
            return EMPTY_SLOTS
        return page_slots(ids, self.block_size)

    def _chain(self, ids: np.ndarray) -> Chain:
        return Chain(self, ids, self._serial[ids], self._drops)

    # ---- admission (abilities.Admission) ------------------------------------------------------
    def stamp(self, chain: Chain) -> int:
        return self._version

    def still_valid(self, chain: Chain, stamp) -> bool:
        # a match reads only which blocks are cached (not ref counts or queue order): it can
        # change only when an insert registers a block, an eviction drops one, or a reset
        return stamp == self._version

    def lock_cost(self, key: RadixKey, chain: Chain, prefix_len: int) -> int:
        # the hit blocks at ref 0 sit in the free queue (evictable) until locked
        return self.refs.unreferenced(chain.ids) * self.block_size if len(chain) else 0

    # ---- insert (vLLM's cache_full_blocks) ------------------------------------------------
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag=None
                ) -> InsertResult[Chain]:
        """Register the full blocks of `key`; `slots` must be whole blocks of the pool. A block
        id already registered with this content counts as cached (prefix_len, up to the first
        new block); a new block whose content another block already has is registered too (a
        duplicate, as in vLLM). New blocks are unreferenced: they join the free queue's tail,
        last block first."""
        bs = self.block_size
        nfull = len(key.buf) // self._row.itemsize
        ids = slots[:nfull * bs:bs] // bs
        # whole blocks: each run of bs slots is its block's first slot plus 0 .. bs - 1
        if nfull and not (page_slots(ids, bs) == slots[:nfull * bs]).all():
            raise ValueError(f"slots are not whole blocks of {bs} (first: {slots[:bs].tolist()})")
        try:
            held = self._node[ids]
        except IndexError:                                    # a block id past the arrays
            self._grow(int(ids.max()))
            held = self._node[ids]
        pages, path = self._walk(key)                         # the nodes key already has
        known = len(path)
        new = (held < 0).nonzero()[0]
        added = ids[new]
        fresh, r = added.tolist(), nfull - len(new)
        # each block either new or registered on its own path node (those are distinct), and
        # no new id twice: else the full check names the first fault as it always has. The
        # usual shape, registered blocks first, is read off two comparisons.
        ordered = r <= known and (r == nfull or new[0] == r) and (
            r == 0 or bool((held[:r] == self._path_ids()[:r]).all()))
        if not ordered:
            on_path = self._path_ids()
            if len(new) + int(np.count_nonzero(held[:known] == on_path)) != nfull:
                reject(ids, held, path)
        if len(set(fresh)) != len(fresh):
            reject(ids, held, path)
        if len(new):
            # known content: one more copy (ordered: the new blocks before the path's end)
            again = np.arange(r, known) if ordered else new[:np.searchsorted(new, known)]
            nodes = self._path_ids()[r:known] if ordered else on_path[again]
            if len(again):
                self._copy(nodes, ids[again])
            if known < nfull:                                 # new content: a chain of new nodes
                parent = path[-1] if path else self._root(key.namespace)
                made, ma = add_nodes(self, parent, pages[known:], added[len(again):])
                self._grown(path, made, ma)                   # the walk memo reaches them too
                nodes = np.concatenate([nodes, ma]) if len(again) else ma
            self._node[added] = nodes
            s = self._next_serial
            self._serial[added] = np.arange(s, s + len(added))
            self._next_serial = s + len(added)
            if self.enable_events:
                store_events(self, key, new.tolist(), path, pages)
            self.refs.queue.push(added[::-1])
            self._nblocks += len(added)
            self._version = next(_versions)
            self.peak_blocks = max(self.peak_blocks, self._nblocks)
        prefix = int(new[0]) if len(new) else nfull
        return InsertResult(prefix * bs, self._chain(ids))

    def _copy(self, nodes: np.ndarray, bids: np.ndarray) -> None:
        """Register blocks `bids` as copies of existing content nodes: the first copy where a
        node has none (content evicted and computed again), else a duplicate."""
        first = self._first
        if (first[nodes] < 0).all():
            first[nodes] = bids
            return
        for n, bid in zip(nodes.tolist(), bids.tolist()):
            if first[n] < 0:
                first[n] = bid
            else:
                self._dups.setdefault(n, []).append(bid)
                self.duplicate_blocks += 1

    def _root(self, ns: tuple) -> int:
        if ns not in self._roots:
            self._roots[ns] = add_nodes(self, -1, [ns], [-1])[0][0]
        return self._roots[ns]

    def _grown(self, path: list[int], made: list[int], ma: np.ndarray) -> None:
        """Extend the kept walk's path (and its array, when complete) by new nodes."""
        last, pages, kept, drops, arr = self._walked
        if len(arr) == len(path):
            self._walked = (last, pages, kept, drops, np.concatenate([arr, ma]) if len(arr) else ma)
        path += made

    def _grow(self, max_id: int) -> None:
        """Make the per-block-id arrays cover `max_id`."""
        n = len(self._node)
        if max_id >= n:
            extra = max(n, max_id + 1 - n)
            self._node, self._serial = (
                np.concatenate([a, np.full(extra, v, a.dtype)]) for a, v in
                ((self._node, -1), (self._serial, 0)))
            self.refs.grow(n + extra)

    # ---- eviction: the free queue's head ------------------------------------------------------
    def _evict(self, num_tokens: int) -> np.ndarray:
        victims = self.refs.queue.pop(-(-num_tokens // self.block_size))
        if not len(victims):
            return EMPTY_SLOTS
        first, dups, nodes = self._first, self._dups, self._node[victims]
        if dups:                                  # a copy may take over its node's hits
            for bid, n in zip(victims.tolist(), nodes.tolist()):
                more = dups.get(n)
                if first[n] != bid:
                    more.remove(bid)    # type: ignore[union-attr]  # a second copy is listed
                else:
                    first[n] = more.pop(0) if more else -1
                if more == []:
                    del dups[n]
            bare = nodes[(first[nodes] < 0) & (self._nk[nodes] == 0)]
        else:                                     # every cached block is its node's first copy
            first[nodes] = -1                     # and its only one: each node is left bare
            bare = nodes[self._nk[nodes] == 0]    # unless it has a child
        if self.enable_events:
            self.log.record(EventRun("removed", list(map(self._hash.__getitem__, nodes.tolist()))))
        self.views.forget(victims.tolist())
        # no copy and no child: pruned later, unless its content comes back first
        self._bare += bare.tolist()
        self._node[victims], self._serial[victims] = -1, 0
        self._nblocks -= len(victims)
        last, pages, path, drops, arr = self._walked
        if drops == self._drops:                  # no node left the trie: the walk still holds
            self._walked = (last, pages, path, drops + 1, arr)
        self._version, self._drops = next(_versions), self._drops + 1
        if len(self._bare) > max(_PRUNE_AT, _PRUNE_SHARE * self._nblocks):
            prune(self)
        return self._slots(victims)

    # ---- locks: the reference counts (refs.py) ------------------------------------------------
    def _check_handle(self, chain) -> None:
        check_handle(self, chain)

    def _check_locked(self, chain) -> None:
        self.refs.check_locked(chain)

    def _inc_lock(self, chain) -> None:
        self.refs.inc(chain)

    def _dec_lock(self, chain) -> None:
        self.refs.dec(chain)

    def _relock(self, old, new) -> None:
        self.refs.relock(old, new)

    # ---- sizes, stats, checks -------------------------------------------------------------
    def evictable_size(self) -> int:
        return self.refs.queue.n * self.block_size

    def protected_size(self) -> int:
        return (self._nblocks - self.refs.queue.n) * self.block_size

    def num_blocks(self) -> int:
        """Blocks cached (a pure read)."""
        return self._nblocks

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str,
                 evict_granularity: str = "page") -> str:
        return f"{cls.name} b{page_size} {hash_algo}"         # evicts in LRU order only

    @property
    def label(self) -> str:
        return self.describe(self.block_size, "lru", self.hash_algo)

    def held_slots(self) -> Iterable[np.ndarray]:
        return [self._slots(np.flatnonzero(self._node >= 0))]

    def stats(self) -> dict[str, int]:
        return {"entries": self._nblocks, "orphan_blocks": orphan_blocks(self),
                "duplicate_blocks": self.duplicate_blocks}

    def free_queue_ids(self) -> list[int]:
        """The free queue, head (next evicted) first."""
        return self.refs.queue.ids().tolist()

    @property
    def blocks(self) -> dict[int, Block]:
        return self.views.blocks()

    @property
    def by_hash(self) -> dict[int, dict[int, Block]]:
        return self.views.by_hash()

    def block_hashes(self, key) -> list[int]:
        return self.views.block_hashes(key)

    def _check_structure(self) -> None:
        check_blockhash(self)

    def _locks_held(self) -> int:
        return self.refs.held()                   # one reference per block of a locked chain

    def _lock_units(self, chain) -> int:
        return len(chain) if chain is not None else 0

    def num_entries(self) -> int:
        return self._nblocks

    # ---- abilities (cache/abilities.py) -----------------------------------------------------
    def events(self) -> EventLog | None:
        return self.log if self.enable_events else None

    def admission(self) -> BlockHashCache:
        return self
