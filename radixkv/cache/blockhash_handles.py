"""The block-hash cache's handles and views: a `Chain` (the blocks of a match or an insert: block
ids and registration serials, two int64 arrays), the `Block`s it reads as, `BlockViews`, the
part of `BlockHashCache` (cache/blockhash.py) that shows its blocks and their chained hashes to
reports and tests, and `BlockLocks`, the part that checks handles and counts their
references. State is read from the cache, so a handle to a block evicted since is told apart
by its serial."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radixkv.cache.base import as_key
from radixkv.cache.events import chain_hash
from radixkv.cache.key import RadixKey

TOKEN = RadixKey().numpy().dtype        # what key.numpy() holds: rows of it are block contents


class Block:
    """One registration of a block id, as handles and reports show it (state is read from the
    cache). While the block stays cached, reading it again gives this same object."""
    __slots__ = ("cache", "id", "serial")

    def __init__(self, cache: Any, block_id: int, serial: int):
        self.cache, self.id, self.serial = cache, block_id, serial

    def cached(self) -> bool:
        return self.id < len(self.cache._serial) and int(self.cache._serial[self.id]) == self.serial

    @property
    def ref_cnt(self) -> int:
        return int(self.cache._ref[self.id]) if self.cached() else 0

    @property
    def hash(self) -> int:
        return self.cache._hash_of(self._node())

    @property
    def parent_hash(self) -> int | None:
        return self.cache._hash_of(self.cache._parent[self._node()])

    def _node(self) -> int:
        if not self.cached():
            raise ValueError(f"{self!r} is no longer cached")
        return int(self.cache._node[self.id])

    def __repr__(self) -> str:
        return f"Block(id={self.id}, ref={self.ref_cnt})"


class Chain(Sequence):
    """A handle: the blocks of a match or an insert as two int64 arrays, ids and registration
    serials (a block evicted since, or its id cached again, no longer matches), read as a tuple
    of Blocks. `drops`: the cache's drop count when the chain was last known all cached."""
    __slots__ = ("cache", "ids", "serials", "drops")

    def __init__(self, cache: Any, ids: np.ndarray, serials: np.ndarray, drops: int):
        self.cache, self.ids, self.serials, self.drops = cache, ids, serials, drops

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Chain(self.cache, self.ids[i], self.serials[i], self.drops)
        return self.cache._block(int(self.ids[i]), int(self.serials[i]))

    def __iter__(self):
        return map(self.cache._block, self.ids.tolist(), self.serials.tolist())

    def __eq__(self, other) -> bool:
        if isinstance(other, (Chain, tuple)):
            return len(self) == len(other) and all(a is b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((id(self.cache), self.ids.tobytes(), self.serials.tobytes()))

    def __add__(self, other):
        return tuple(self) + tuple(other) if isinstance(other, (Chain, tuple)) else NotImplemented

    def __repr__(self) -> str:
        return f"Chain({self.ids.tolist()})"


class BlockViews:
    """Blocks and chained hashes as reports and tests read them (built on demand)."""

    def _block(self, bid: int, serial: int) -> Block:
        b = self._views.get(bid)
        if b is None or b.serial != serial:
            b = Block(self, bid, serial)
            if b.cached():
                self._views[bid] = b
        return b

    @property
    def blocks(self) -> dict[int, Block]:
        """block id -> Block, oldest first (built on demand)."""
        ids = np.flatnonzero(self._serial)
        ids = ids[np.argsort(self._serial[ids])]
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
        """Chained hash of node n (None for a root), computing missing ones on its path."""
        path = []
        while n >= 0:
            path.append(n)
            n = self._parent[n]
        ns, h = self._page[path.pop()], None                  # the root holds the namespace
        for i, m in enumerate(reversed(path)):
            if m not in self._hash:
                page = RadixKey(np.frombuffer(self._page[m], TOKEN)).page(0, self.block_size)
                self._hash[m] = chain_hash(h, ns if i == 0 else (ns[0], None), page, self.hash_algo)
            h = self._hash[m]
        return h


class BlockLocks:
    """Reference counts: a handle's blocks are locked and unlocked together (a Chain in a few
    vectorised steps), leaving and rejoining the free queue's tail."""

    def locks_held(self) -> int:
        return int(self._ref.sum())               # one reference per block of a locked chain

    def lock_units(self, chain) -> int:
        return len(chain) if chain is not None else 0

    def lock_cost(self, key: RadixKey, chain, prefix_len: int) -> int:
        # the hit blocks at ref 0 sit in the free queue (evictable) until locked
        return int((self._ref[chain.ids] == 0).sum()) * self.block_size if len(chain) else 0

    def _runs(self, chain) -> list[np.ndarray]:
        """The id arrays a checked handle is locked or unlocked in, in order: a Chain's blocks
        are distinct, one vectorised step; a hand-made tuple may list a block twice, so it
        goes one block at a time, exactly as listed."""
        if isinstance(chain, Chain):
            return [chain.ids]
        return [np.array([b.id], np.int64) for b in chain or ()]

    def _inc_lock(self, chain) -> None:
        for ids in self._runs(chain):
            self._lock_ids(ids)

    def _lock_ids(self, ids: np.ndarray) -> None:
        ref = self._ref[ids]
        leaving = ids[ref == 0]                               # their queue entries go stale
        self._queue.remove(leaving)
        self._ref[ids] = ref + 1

    def _relock(self, old, new) -> None:
        # a chain extending the one it replaces: its shared blocks keep their count (+1 - 1,
        # never reaching 0), so only the blocks past the old chain are locked
        if isinstance(old, Chain) and isinstance(new, Chain) and len(old) <= len(new) \
                and (new.ids[:len(old)] == old.ids).all():
            self._lock_ids(new.ids[len(old):])
            return
        self._inc_lock(new)
        self._dec_lock(old)

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
            ref = self._ref[rev] - 1
            self._ref[rev] = ref
            self._queue.push(rev[ref == 0])

    def _check_handle(self, chain) -> None:
        if chain is None:
            return
        ours = isinstance(chain, Chain) and chain.cache is self
        if ours and chain.drops == self._drops:
            return                                            # nothing dropped since: all cached
        if ours:                                  # its ids index the arrays (never shrunk)
            stale = len(chain.ids) and (self._serial[chain.ids] != chain.serials).any()
        elif isinstance(chain, Chain):
            stale = len(chain.ids) > 0
        elif isinstance(chain, tuple) and all(isinstance(b, Block) for b in chain):
            ids = np.fromiter((b.id for b in chain), np.int64, len(chain))
            serials = np.fromiter((b.serial for b in chain), np.int64, len(chain))
            stale = len(ids) and (not all(b.cache is self for b in chain)
                                  or not (ids < len(self._serial)).all()
                                  or (self._serial[ids] != serials).any())
        else:
            raise TypeError(f"expected a Chain or a tuple of Blocks from match_prefix, got {chain!r}")
        if stale:
            bad = next(b for b in chain if b.cache is not self or not b.cached())
            raise ValueError(f"{bad!r} is no longer cached (evicted or foreign)")
        if isinstance(chain, Chain):
            chain.drops = self._drops
