"""The block-hash cache's handles and views: a `Chain` (the blocks of a match or an insert: block
ids and registration serials, two int64 arrays), the `Block`s it reads as, and `BlockViews`, the
part of `BlockHashCache` (cache/blockhash.py) that shows its blocks and their chained hashes to
reports and tests. State is read from the cache, so a handle to a block evicted since is told
apart by its serial."""
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
