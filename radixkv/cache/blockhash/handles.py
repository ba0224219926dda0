"""The block-hash cache's handles and views: a `Chain` (the blocks of a match or an insert: block
ids and registration serials, two int64 arrays), the `Block`s it reads as, `check_handle`, and
`BlockViews`, the collaborator of `BlockHashCache` (cache/blockhash/cache.py) that owns the
Block memo and shows blocks and their chained hashes to reports and tests. State is read from
the cache, so a handle to a block evicted since is told apart by its serial."""
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
        return int(self.cache.refs.ref[self.id]) if self.cached() else 0

    @property
    def hash(self) -> int:
        return self.cache.views.hash_of(self._node())

    @property
    def parent_hash(self) -> int | None:
        return self.cache.views.hash_of(self.cache._parent[self._node()])

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
        return self.cache.views.block(int(self.ids[i]), int(self.serials[i]))

    def __iter__(self):
        return map(self.cache.views.block, self.ids.tolist(), self.serials.tolist())

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
    """Blocks and chained hashes as reports and tests read them (built on demand); owns the
    memo that makes reading a cached block twice give the same Block."""

    def __init__(self, cache: Any):
        self.cache = cache
        self.memo: dict[int, Block] = {}          # block id -> its Block, once one was read

    def block(self, bid: int, serial: int) -> Block:
        b = self.memo.get(bid)
        if b is None or b.serial != serial:
            b = Block(self.cache, bid, serial)
            if b.cached():
                self.memo[bid] = b
        return b

    def forget(self, ids: list[int]) -> None:
        """Blocks `ids` left the cache."""
        if self.memo:
            for bid in ids:
                self.memo.pop(bid, None)

    def blocks(self) -> dict[int, Block]:
        """block id -> Block, oldest first."""
        c = self.cache
        ids = np.flatnonzero(c._serial)
        ids = ids[np.argsort(c._serial[ids])]
        return {b: self.block(b, s) for b, s in zip(ids.tolist(), c._serial[ids].tolist())}

    def by_hash(self) -> dict[int, dict[int, Block]]:
        """hash -> {block id: block}, oldest first (lookups use the trie)."""
        out: dict[int, dict[int, Block]] = {}
        for bid, b in self.blocks().items():
            out.setdefault(b.hash, {})[bid] = b
        return out

    def block_hashes(self, key: RadixKey) -> list[int]:
        """Chained hashes of the full blocks of `key`."""
        c = self.cache
        key, bs, out, parent = as_key(key), c.block_size, [], None
        for i in range(len(key) // bs):
            ns = key.namespace if i == 0 else (key.namespace[0], None)   # salt: first block
            parent = chain_hash(parent, ns, key.page(i, bs), c.hash_algo)
            out.append(parent)
        return out

    def hash_of(self, n: int) -> int | None:
        """Chained hash of node n (None for a root), computing missing ones on its path."""
        c, path = self.cache, []
        while n >= 0:
            path.append(n)
            n = c._parent[n]
        ns, h = c._page[path.pop()], None                     # the root holds the namespace
        for i, m in enumerate(reversed(path)):
            if m not in c._hash:
                page = RadixKey(np.frombuffer(c._page[m], TOKEN)).page(0, c.block_size)
                c._hash[m] = chain_hash(h, ns if i == 0 else (ns[0], None), page, c.hash_algo)
            h = c._hash[m]
        return h


def check_handle(cache: Any, chain) -> None:
    """Raise TypeError/ValueError unless `chain` is a live handle of `cache` (None: the empty
    one)."""
    if chain is None:
        return
    ours = isinstance(chain, Chain) and chain.cache is cache
    if ours and chain.drops == cache._drops:
        return                                            # nothing dropped since: all cached
    if ours:                                  # its ids index the arrays (never shrunk)
        stale = len(chain.ids) and (cache._serial[chain.ids] != chain.serials).any()
    elif isinstance(chain, Chain):
        stale = len(chain.ids) > 0
    elif isinstance(chain, tuple) and all(isinstance(b, Block) for b in chain):
        ids = np.fromiter((b.id for b in chain), np.int64, len(chain))
        serials = np.fromiter((b.serial for b in chain), np.int64, len(chain))
        stale = len(ids) and (not all(b.cache is cache for b in chain)
                              or not (ids < len(cache._serial)).all()
                              or (cache._serial[ids] != serials).any())
    else:
        raise TypeError(f"expected a Chain or a tuple of Blocks from match_prefix, got {chain!r}")
    if stale:
        bad = next(b for b in chain if b.cache is not cache or not b.cached())
        raise ValueError(f"{bad!r} is no longer cached (evicted or foreign)")
    if isinstance(chain, Chain):
        chain.drops = cache._drops
