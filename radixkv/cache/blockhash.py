"""BlockHashCache: vLLM-style automatic prefix caching behind the PrefixCache interface.

KV lives in fixed blocks of `block_size` tokens (= SlotPool pages). vLLM keys a full block by a
hash chained on its parent block's hash, its token ids and its extra key (cache_salt is mixed
into the first block only, so it salts the whole chain). Lookups walk the chain and stop at
the first missing block; they change no state.

The index. A chained hash names (namespace, every token up to the end of the block). This
cache keeps that identity exactly, without hashing, as a trie of block contents: a root node
per namespace, and a node per distinct content under its parent's, found in `_child` by
(parent node, the block's token ids as bytes) — compared in full, so nothing can collide. A
node lists the blocks cached with its content, oldest first (vLLM's hash -> blocks bucket:
two or more when identical content was computed twice; the oldest serves hits), and lives
while it has blocks or children, so an orphan (a block whose parent block was evicted) is
found again once its parent content returns, as under a hash chain. The chained hashes
(`hash_algo`) are computed by `chain_hash` for every stored block when events are on (they are
the events' identity) and on first use otherwise (`Block.hash`, `by_hash`, `block_hashes`).

Block states (the free queue of vLLM split in two):
  unhashed, unused    -> the SlotPool (vLLM puts these at the head of the free queue)
  cached, ref_cnt > 0 -> here, protected (a running request uses it)
  cached, ref_cnt = 0 -> here, in the LRU free queue; evict() pops its head and drops the block
Allocation takes the SlotPool first and evicts only when it is empty, which is exactly vLLM's
order: unhashed blocks are always ahead of cached ones in its single queue. A request's blocks
return to the tail in reverse order (last block first), so leaves are evicted before their
parents. No dedup on insert: identical content computed twice is cached twice
(`duplicate_blocks` counts it).

Layout. State is columnar, not one Python object per block: a cache of a million blocks would
otherwise hold millions of objects that every full garbage collection walks. Per block id:
numpy arrays (a chain is locked, checked or unlocked in a few vectorised operations); per
node: Python lists (read one entry at a time while walking). A handle is a `Chain` of block
ids and registration serials; `Block` objects are made only when someone reads one.
"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Iterable

import numpy as np

from radixkv.cache.base import InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.events import KVEvent, chain_hash, check_hash_algo
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS

_TOKEN = RadixKey().numpy().dtype       # what key.numpy() holds: rows of it are block contents
_versions = itertools.count(1)          # match stamps, unique across caches and resets


def _first_repeat(ids: np.ndarray) -> int:
    seen: set[int] = set()
    for b in ids.tolist():
        if b in seen:
            return b
        seen.add(b)
    return -1


class Block:
    """One registration of a block id, as handles and reports show it (state is read from the
    cache). While it is cached, reading it again gives this same object."""
    __slots__ = ("cache", "id", "serial")

    def __init__(self, cache: BlockHashCache, block_id: int, serial: int):
        self.cache, self.id, self.serial = cache, block_id, serial

    def cached(self) -> bool:
        c = self.cache
        return self.id < len(c._serial) and int(c._serial[self.id]) == self.serial

    @property
    def ref_cnt(self) -> int:
        return int(self.cache._ref[self.id]) if self.cached() else 0

    @property
    def hash(self) -> int:
        if not self.cached():
            raise ValueError(f"{self!r} is no longer cached")
        return self.cache._hash_of(int(self.cache._node[self.id]))

    @property
    def parent_hash(self) -> int | None:
        if not self.cached():
            raise ValueError(f"{self!r} is no longer cached")
        return self.cache._hash_of(self.cache._key[int(self.cache._node[self.id])][0])

    def __repr__(self) -> str:
        return f"Block(id={self.id}, ref={self.ref_cnt})"


class Chain(Sequence):
    """A handle: the blocks a match or an insert returned, as ids and registration serials
    (two int64 arrays; a block evicted since, or its id cached again, no longer matches)."""
    __slots__ = ("cache", "ids", "serials")

    def __init__(self, cache: BlockHashCache, ids: np.ndarray, serials: np.ndarray):
        self.cache, self.ids, self.serials = cache, ids, serials

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Chain(self.cache, self.ids[i], self.serials[i])
        return self.cache._block(int(self.ids[i]), int(self.serials[i]))

    def __iter__(self):
        return map(self.cache._block, self.ids.tolist(), self.serials.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, (Chain, tuple)):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self.cache), self.ids.tobytes(), self.serials.tobytes()))

    def __add__(self, other):                 # joins like the tuple of Blocks it stands for
        return tuple(self) + tuple(other) if isinstance(other, (Chain, tuple)) else NotImplemented

    def __radd__(self, other):
        return tuple(other) + tuple(self) if isinstance(other, tuple) else NotImplemented

    def __repr__(self) -> str:
        return f"Chain({self.ids.tolist()})"


class BlockHashCache(PrefixCache):
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
        self._qpos = np.full(1024, -1, np.int64)      # its free-queue entry; -1: not queued
        self._serials = itertools.count(1)            # never reset: old handles stay stale
        self._drops = 0                               # bumped whenever blocks leave
        self.reset()
        self._events.clear()                          # "cleared" is for an explicit reset() only

    def reset(self) -> None:
        for a, v in ((self._node, -1), (self._serial, 0), (self._ref, 0), (self._qpos, -1)):
            a.fill(v)
        # per content node; ids of dropped nodes are reused
        self._key: list = []                  # (parent node, page); a root's: (-1, namespace)
        self._first: list[int] = []           # oldest cached copy (block id), -1 if none
        self._nkids: list[int] = []           # children in _child
        self._hash: list[int | None] = []     # chained hash, once computed
        self._dups: dict[int, list[int]] = {}     # node -> its later copies, oldest first
        self._free_nodes: list[int] = []
        self._child: dict[tuple, int] = {}        # (parent node, page) -> node
        self._roots: dict[tuple, int] = {}        # namespace -> root node
        self._views: dict[int, Block] = {}        # block id -> its Block, once one was read
        # The free queue: block ids in the order they reached ref 0, head first. An entry is
        # live while _qpos of its block points at it: locking a block just stales its entry.
        self._qlog = np.zeros(1024, np.int64)
        self._qhead = self._qtail = self._nfree = 0         # live entries lie in [head, tail)
        self._nblocks = self.duplicate_blocks = self.peak_blocks = 0
        self._walked: tuple = (RadixKey(), [], -1)          # the last walk: key, path, drops
        self._version = next(_versions)                     # changes whenever a match could
        self._drops += 1
        if self.enable_events:
            self._events.append(KVEvent("cleared"))

    # ---- blocks and hashes as reports and tests see them ------------------------------------
    def _block(self, bid: int, serial: int) -> Block:
        b = self._views.get(bid)
        if b is None or b.serial != serial:
            b = Block(self, bid, serial)
            if b.cached():
                self._views[bid] = b
        return b

    def _cached_ids(self) -> np.ndarray:
        """Cached block ids, oldest registration first."""
        ids = np.flatnonzero(self._serial)
        return ids[np.argsort(self._serial[ids], kind="stable")]

    @property
    def blocks(self) -> dict[int, Block]:
        """block id -> Block, oldest first (built on demand)."""
        ids = self._cached_ids()
        return {b: self._block(b, s) for b, s in zip(ids.tolist(), self._serial[ids].tolist())}

    @property
    def by_hash(self) -> dict[int, dict[int, Block]]:
        """hash -> {block id: block}, oldest first (built on demand; lookups use the trie)."""
        out: dict[int, dict[int, Block]] = {}
        for bid, b in self.blocks.items():
            out.setdefault(b.hash, {})[bid] = b
        return out

    def block_hashes(self, key: RadixKey) -> list[int]:
        """Chained hashes of the full blocks of `key`."""
        key, bs, out, parent = as_key(key), self.block_size, [], None
        for i in range(len(key) // bs):
            ns = key.namespace if i == 0 else (key.namespace[0], None)   # salt: first block
            parent = chain_hash(parent, ns, key.page(i, bs), self.hash_algo)
            out.append(parent)
        return out

    def _hash_of(self, n: int) -> int | None:
        """Chained hash of node n's content (None for a root: a first block's parent hash),
        computing missing ones along its path."""
        path = []
        while n >= 0:
            path.append(n)
            n = self._key[n][0]
        ns, h = self._key[path.pop()][1], None                # the root holds the namespace
        for i, m in enumerate(reversed(path)):
            if self._hash[m] is None:
                page = RadixKey(np.frombuffer(self._key[m][1], _TOKEN)).page(0, self.block_size)
                self._hash[m] = chain_hash(h, ns if i == 0 else (ns[0], None), page, self.hash_algo)
            h = self._hash[m]
        return h

    # ---- lookup ---------------------------------------------------------------------------
    def _pages(self, key: RadixKey) -> list[bytes]:
        """Contents of `key`'s full blocks: key.numpy() cut into rows of block_size ids, each
        row as one bytes value (equal exactly when the token ids are), in one C call."""
        toks = key.numpy()
        return toks[:len(toks) - len(toks) % self.block_size].view(self._row).tolist()

    def _path(self, key: RadixKey, pages: list[bytes]) -> list[int]:
        """The trie nodes along `key`'s full blocks, as far as they exist (through nodes with
        no cached copy). Resumes the previous walk over the whole blocks `key` shares with it
        (a request's match and its inserts walk one prefix); nodes leave the trie only when
        blocks are dropped, which ends the reuse."""
        last, path, drops = self._walked
        if drops == self._drops and last.namespace == key.namespace:
            path = path[:key.shared(last) // self.block_size]
        else:
            path = []
        node = path[-1] if path else self._roots.get(key.namespace)
        if node is not None:
            child = self._child
            for page in itertools.islice(pages, len(path), None):
                node = child.get((node, page))
                if node is None:
                    break
                path.append(node)
        self._walked = (key, path, self._drops)
        return path

    def _match(self, key: RadixKey, split: bool) -> MatchResult:
        """Hit blocks of `key`, stopping at the first block with no cached copy. Changes
        nothing but the walk memo."""
        heads = list(map(self._first.__getitem__, self._path(key, self._pages(key))))
        if -1 in heads:
            del heads[heads.index(-1):]
        ids = np.array(heads, np.int64)
        return MatchResult(len(ids) * self.block_size, self._slots(ids),
                           Chain(self, ids, self._serial[ids]))

    def lookup(self, prompt: RadixKey) -> MatchResult:
        """vLLM's get_computed_blocks: the last prompt token is always recomputed, so a full
        hit is capped at len - 1 and then rounded down to a whole block."""
        prompt = as_key(prompt)
        return self.match_prefix(prompt[:max(len(prompt) - 1, 0)])

    def _slots(self, ids: np.ndarray) -> np.ndarray:
        if not len(ids):
            return EMPTY_SLOTS
        return (ids[:, None] * self.block_size + np.arange(self.block_size)).ravel()

    def match_stamp(self, chain) -> int:
        return self._version

    def match_valid(self, chain, stamp) -> bool:
        # a match reads only which blocks are cached (not ref counts or queue order): it can
        # change only when an insert registers a block, an eviction drops one, or a reset
        return stamp == self._version

    # ---- insert (vLLM's cache_full_blocks) ------------------------------------------------
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int) -> InsertResult:
        """Register the full blocks of `key`; `slots` must be whole blocks of the pool. A block
        id already registered with this content counts as cached (prefix_len, up to the first
        new block); a new block whose content another block already has is registered too (a
        duplicate, as in vLLM). New blocks are unreferenced: they join the free queue's tail,
        last block first."""
        bs = self.block_size
        nfull = len(key) // bs
        page = slots[:nfull * bs].reshape(nfull, bs)
        ids = page[:, 0] // bs
        if nfull and not ((page[:, 0] % bs == 0).all() and (page == page[:, :1] + np.arange(bs)).all()):
            raise ValueError(f"slots are not whole blocks of {bs} (first: {slots[:bs].tolist()})")
        if len(set(ids.tolist())) != nfull:
            raise ValueError(f"insert lists block {_first_repeat(ids)} twice")
        self._grow(int(ids.max()) if nfull else 0)
        pages = self._pages(key)
        path = self._path(key, pages)                         # the nodes key already has
        held, want = self._node[ids], np.full(nfull, -1, np.int64)
        want[:len(path)] = path
        bad = (held >= 0) & (held != want)                    # a registered id, other content
        if bad.any():
            raise ValueError(f"block {int(ids[bad.argmax()])} is already registered with other content")
        new = np.flatnonzero(held < 0)
        if len(new):
            ns, nodes = key.namespace, []
            for i, bid in zip(new.tolist(), ids[new].tolist()):
                if i < len(path):                             # known content: one more copy
                    n = path[i]
                    if self._first[n] < 0:
                        self._first[n] = bid
                    else:
                        self._dups.setdefault(n, []).append(bid)
                        self.duplicate_blocks += 1
                else:                                         # new content (extends the memo)
                    parent = path[i - 1] if i else self._root(ns)
                    n = self._new_node(parent, pages[i], bid)
                    path.append(n)
                    if self.enable_events:                    # events carry the chained hash
                        self._hash[n] = chain_hash(self._hash[parent], ns if i == 0 else (ns[0], None),
                                                   key.page(i, bs), self.hash_algo)
                nodes.append(n)
                if self.enable_events:
                    self._events.append(KVEvent("stored", self._hash[n], self._hash[self._key[n][0]],
                                                tuple(key[i * bs:(i + 1) * bs]), ns))
            added = ids[new]
            self._node[added] = nodes
            self._serial[added] = np.fromiter(self._serials, np.int64, len(added))
            self._enqueue(added[::-1])
            self._nblocks += len(added)
            self._version = next(_versions)
            self.peak_blocks = max(self.peak_blocks, self._nblocks)
        prefix = int(new[0]) if len(new) else nfull
        return InsertResult(prefix * bs, Chain(self, ids, self._serial[ids]))

    def _root(self, ns: tuple) -> int:
        n = self._roots.get(ns)
        if n is None:
            n = self._roots[ns] = self._new_node(-1, ns, -1)
        return n

    def _new_node(self, parent: int, page, first: int) -> int:
        key = (parent, page)
        if self._free_nodes:
            n = self._free_nodes.pop()
            self._key[n], self._first[n], self._nkids[n], self._hash[n] = key, first, 0, None
        else:
            n = len(self._key)
            for column, v in ((self._key, key), (self._first, first), (self._nkids, 0), (self._hash, None)):
                column.append(v)
        if parent >= 0:
            self._child[key] = n
            self._nkids[parent] += 1
        return n

    def _grow(self, max_id: int) -> None:
        """Make the per-block-id arrays cover `max_id`."""
        n = len(self._ref)
        if max_id >= n:
            extra = max(n, max_id + 1 - n)
            self._node, self._serial, self._ref, self._qpos = (
                np.concatenate([a, np.full(extra, v, a.dtype)]) for a, v in
                ((self._node, -1), (self._serial, 0), (self._ref, 0), (self._qpos, -1)))

    # ---- the free queue -------------------------------------------------------------------
    def _enqueue(self, ids: np.ndarray) -> None:
        """Append blocks (cached, none queued) to the tail, in order."""
        k, t = len(ids), self._qtail
        if t + k > len(self._qlog):                           # compact; grow when half full
            live = self._queue_ids()
            self._qlog = np.zeros(max(len(self._qlog), 2 * (len(live) + k)), np.int64)
            self._qlog[:len(live)] = live
            self._qpos[live] = np.arange(len(live))
            self._qhead, t = 0, len(live)
        self._qlog[t:t + k] = ids
        self._qpos[ids] = np.arange(t, t + k)
        self._qtail, self._nfree = t + k, self._nfree + k

    def _unqueue(self, ids: np.ndarray) -> None:
        self._qpos[ids] = -1
        self._nfree -= len(ids)

    def _queue_ids(self) -> np.ndarray:
        h, t = self._qhead, self._qtail
        return self._qlog[h:t][self._qpos[self._qlog[h:t]] == np.arange(h, t)]

    # ---- evict ----------------------------------------------------------------------------
    def _evict(self, num_tokens: int) -> np.ndarray:
        need, out = -(-num_tokens // self.block_size), []
        while need and self._nfree:                           # pop the head's live entries
            h = self._qhead
            seg = self._qlog[h:min(self._qtail, h + max(2 * need, 256))]
            live = np.flatnonzero(self._qpos[seg] == np.arange(h, h + len(seg)))[:need]
            self._qhead = h + (int(live[-1]) + 1 if len(live) == need else len(seg))
            out.append(seg[live])
            self._unqueue(out[-1])
            need -= len(live)
        if not out:
            return EMPTY_SLOTS
        victims = np.concatenate(out)
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
            while self._first[n] < 0 and not self._nkids[n]:  # drop content nothing refers to
                parent, page = self._key[n]
                if parent < 0:
                    del self._roots[page]
                else:
                    del self._child[parent, page]
                self._key[n] = self._hash[n] = None
                self._free_nodes.append(n)
                if parent < 0:
                    break
                self._nkids[parent] -= 1
                n = parent
        self._node[victims], self._serial[victims] = -1, 0
        self._nblocks -= len(victims)
        self._version, self._drops = next(_versions), self._drops + 1
        return self._slots(victims)

    # ---- reference counts -----------------------------------------------------------------
    def _ids(self, chain) -> tuple[np.ndarray, bool]:
        """Block ids of a checked handle, and whether they are distinct (true of every Chain;
        a hand-made tuple may list a block twice)."""
        if isinstance(chain, Chain):
            return chain.ids, True
        ids = np.fromiter((b.id for b in chain), np.int64, len(chain))
        return ids, len(np.unique(ids)) == len(ids)

    def _inc_lock(self, chain) -> None:
        if not chain:
            return
        ids, distinct = self._ids(chain)
        uses = 1 if distinct else None
        if not distinct:
            ids, uses = np.unique(ids, return_counts=True)
        ref = self._ref[ids]
        self._unqueue(ids[ref == 0])
        self._ref[ids] = ref + uses

    def _check_locked(self, chain) -> None:
        if not chain:
            return
        ids, distinct = self._ids(chain)
        held, uses = (ids, 1) if distinct else np.unique(ids, return_counts=True)
        if (self._ref[held] >= uses).all():
            return
        seen: dict[int, int] = {}
        for b in chain:                                       # a block listed k times needs k refs
            seen[b.id] = seen.get(b.id, 0) + 1
            if self._ref[b.id] < seen[b.id]:
                raise ValueError(f"dec_lock_ref on unreferenced {b!r}")

    def _dec_lock(self, chain) -> None:
        if not chain:
            return
        ids, distinct = self._ids(chain)
        rev = ids[::-1]                                       # last block reaches the tail first
        if distinct:
            self._ref[rev] -= 1
            freed = rev[self._ref[rev] == 0]
        else:
            np.subtract.at(self._ref, rev, 1)
            freed = rev[self._ref[rev] == 0][::-1]
            _, first = np.unique(freed, return_index=True)    # a block listed twice reached 0
            freed = freed[np.sort(first)][::-1]               # at its last listing in `rev`
        self._enqueue(freed)

    def _check_handle(self, chain) -> None:
        if chain is None:
            return
        if isinstance(chain, Chain):
            ids, serials, ours = chain.ids, chain.serials, chain.cache is self
        elif isinstance(chain, tuple) and all(isinstance(b, Block) for b in chain):
            ids = np.fromiter((b.id for b in chain), np.int64, len(chain))
            serials = np.fromiter((b.serial for b in chain), np.int64, len(chain))
            ours = all(b.cache is self for b in chain)
        else:
            raise TypeError(f"expected a Chain or a tuple of Blocks from match_prefix, got {chain!r}")
        if not ours or not (ids < len(self._serial)).all() or (self._serial[ids] != serials).any():
            bad = next(b for b in chain if b.cache is not self or not b.cached())
            raise ValueError(f"{bad!r} is no longer cached (evicted or foreign)")

    # ---- sizes and stats ------------------------------------------------------------------
    def evictable_size(self) -> int:
        return self._nfree * self.block_size

    def protected_size(self) -> int:
        return (self._nblocks - self._nfree) * self.block_size

    def num_blocks(self) -> int:
        return self._nblocks

    num_entries = num_blocks

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str) -> str:
        return f"{cls.name} b{page_size} {hash_algo}"         # evicts in LRU order only

    @property
    def label(self) -> str:
        return self.describe(self.block_size, "lru", self.hash_algo)

    def stats(self) -> dict[str, int]:
        return {"orphan_blocks": self.orphan_blocks(), "duplicate_blocks": self.duplicate_blocks}

    def orphan_blocks(self) -> int:
        """Cached blocks whose parent content has no cached copy: unreachable until it returns."""
        parents = (self._key[n][0] for n in self._node[self._node >= 0].tolist())
        return sum(1 for p in parents if self._key[p][0] >= 0 and self._first[p] < 0)

    def free_queue_ids(self) -> list[int]:
        return self._queue_ids().tolist()

    def held_slots(self) -> Iterable[np.ndarray]:
        return [self._slots(np.flatnonzero(self._node >= 0))]

    def take_events(self) -> list[KVEvent]:
        ev, self._events = self._events, []
        return ev

    def check_invariants(self) -> None:
        # nodes: live ids are the roots, the _child entries and nothing else, each filed under
        # its own key; every one has a cached copy or a child (roots: a child, no copy)
        live = set(self._roots.values()) | set(self._child.values())
        free = set(self._free_nodes)
        assert not live & free and live | free == set(range(len(self._key))) \
            and len(self._free_nodes) == len(free), "node ids are not exactly live or free"
        kids: dict[int, list[int]] = {n: [] for n in live}
        for ns, r in self._roots.items():
            assert self._key[r] == (-1, ns) and self._first[r] == -1 and r not in self._dups, \
                f"bad root for namespace {ns}"
        for key, n in self._child.items():
            assert self._key[n] == key and key[0] in live, f"node {n} is filed under {key[:1]}"
            kids[key[0]].append(n)
        for n in live:
            assert self._nkids[n] == len(kids[n]), f"node {n} counts {self._nkids[n]} children"
            assert self._first[n] >= 0 or kids[n], f"node {n} has no copy and no child"
        # copies: every cached block is listed once, on its own node; serials say which are
        copies = [(b, n) for n in live for b in ([self._first[n]] if self._first[n] >= 0 else [])
                  + self._dups.get(n, [])]
        assert all(self._first[n] >= 0 and v for n, v in self._dups.items()), "a stray copy list"
        cached = np.flatnonzero(self._node >= 0)
        assert sorted(b for b, _ in copies) == cached.tolist(), "copies != cached blocks"
        assert all(self._node[b] == n for b, n in copies), "a block listed under another node"
        assert ((self._serial > 0) == (self._node >= 0)).all(), "serial without a node, or none"
        assert len(set(self._serial[cached].tolist())) == len(cached), "a serial used twice"
        assert self._nblocks == len(cached), f"count {self._nblocks} != {len(cached)} cached"
        assert all(v.cached() for v in self._views.values()), "a view of an evicted block"
        # hashes, where computed, chain as block_hashes chains them
        stack = [(r, ns, True) for ns, r in self._roots.items()]
        while stack:
            n, ns, first = stack.pop()
            for k in kids[n]:
                h = self._hash[k]
                page = RadixKey(np.frombuffer(self._key[k][1], _TOKEN)).page(0, self.block_size)
                assert h is not None or not self.enable_events, f"node {k} has no hash, events on"
                assert h is None or h == chain_hash(self._hash[n], ns if first else (ns[0], None),
                                                    page, self.hash_algo), f"node {k}: wrong hash"
                stack.append((k, ns, False))
        # ref counts and the free queue: exactly the cached blocks at ref 0, each once
        assert (self._ref >= 0).all(), f"negative ref count at block {int(np.argmin(self._ref))}"
        off = self._node < 0
        assert not self._ref[off].any() and (self._qpos[off] == -1).all(), \
            "an uncached block id has a ref count or a queue entry"
        q = cached[self._qpos[cached] != -1]
        pos = self._qpos[q]
        assert ((pos >= self._qhead) & (pos < self._qtail)).all() and (self._qlog[pos] == q).all(), \
            "a queue position points at no entry of its block"
        assert q.tolist() == cached[self._ref[cached] == 0].tolist(), \
            "free queue is not exactly the cached blocks with ref_cnt 0"
        assert len(q) == self._nfree == len(self._queue_ids()), f"free count {self._nfree} is off"
        assert self.peak_blocks >= self._nblocks, "peak below the current count"
