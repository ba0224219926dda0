"""BlockHashCache: vLLM-style automatic prefix caching behind the PrefixCache interface.

KV lives in fixed blocks of `block_size` tokens (= SlotPool pages). A full block is keyed by a
hash chained on its parent block's hash, its token ids and its extra key (cache_salt is mixed
into the first block only, so it salts the whole chain). Lookups walk the chain and stop at
the first missing block; they change no state.

Block states and where they live (the free queue of vLLM split in two):
  unhashed, unused    -> the SlotPool (vLLM puts these at the head of the free queue)
  hashed, ref_cnt > 0 -> here, protected (a running request uses it)
  hashed, ref_cnt = 0 -> here, in the LRU free queue; evict() pops its head and drops the hash
Allocation takes the SlotPool first and evicts only when it is empty, which is exactly vLLM's
order: unhashed blocks are always ahead of hashed ones in its single queue.
A request's blocks return to the tail in reverse order (last block first), so leaves are
evicted before their parents. No dedup on insert: identical content computed twice is cached
twice under one hash (`duplicate_blocks` counts it).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterable

import numpy as np

from radixkv.cache.base import InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.events import KVEvent, chain_hash, check_hash_algo
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS


def _first_repeat(ids: np.ndarray) -> int:
    seen: set[int] = set()
    for b in ids.tolist():
        if b in seen:
            return b
        seen.add(b)
    return -1


class Block:
    __slots__ = ("id", "hash", "parent_hash", "ref_cnt")

    def __init__(self, block_id: int, h: int, parent_hash: int | None):
        self.id, self.hash, self.parent_hash, self.ref_cnt = block_id, h, parent_hash, 0

    def __repr__(self) -> str:
        return f"Block(id={self.id}, ref={self.ref_cnt})"


class BlockHashCache(PrefixCache):
    name = "blockhash"

    def __init__(self, block_size: int = 16, hash_algo: str = "sha256", enable_events: bool = False):
        super().__init__(block_size, "block_size")
        self.block_size = block_size
        self.hash_algo, self.enable_events = check_hash_algo(hash_algo), enable_events
        self._events: list[KVEvent] = []
        self.reset()
        self._events.clear()                      # "cleared" is for an explicit reset() only

    def reset(self) -> None:
        self.blocks: dict[int, Block] = {}                    # block id -> registered block
        self.by_hash: dict[int, dict[int, Block]] = {}        # hash -> {block id: block}
        self.free_queue: OrderedDict[int, Block] = OrderedDict()   # LRU: head is evicted first
        self.duplicate_blocks = 0
        self.peak_blocks = 0
        self._hash_memo: OrderedDict[RadixKey, list[int]] = OrderedDict()
        self._recent: deque[RadixKey] = deque(maxlen=4)
        if self.enable_events:
            self._events.append(KVEvent("cleared"))

    # ---- hashing --------------------------------------------------------------------------
    def block_hashes(self, key: RadixKey) -> list[int]:
        """Chained hashes of the full blocks of `key`. Memoised per key (bounded): schedulers
        ask about the same waiting prompt every round, and a request's insert re-hashes the
        blocks its lookup hashed."""
        memo = self._hash_memo
        out = memo.get(key)
        if out is not None:
            memo.move_to_end(key)
            return out
        bs, extra, salt = self.block_size, key.namespace[0], key.namespace[1]
        n = len(key) // bs
        out, parent, start = [], None, 0
        for k in reversed(self._recent):                  # resume from a key this one extends
            if len(k) // bs <= n and len(k) >= bs and key.startswith(k[:len(k) // bs * bs]):
                out = list(memo[k][:n]) if k in memo else []
                start = len(out)
                parent = out[-1] if out else None
                break
        for i in range(start, n):
            ns = (extra, salt if i == 0 else None)
            parent = chain_hash(parent, ns, key.page(i, bs), self.hash_algo)
            out.append(parent)
        memo[key] = out
        self._recent.append(key)
        if len(memo) > 1024:
            memo.popitem(last=False)
        return out

    # ---- lookup ---------------------------------------------------------------------------
    def _match(self, key: RadixKey, split: bool) -> MatchResult:
        """Hit blocks of `key`, stopping at the first missing block. Never mutates."""
        chain: list[Block] = []
        for h in self.block_hashes(key):
            hit = self.by_hash.get(h)
            if not hit:
                break
            chain.append(next(iter(hit.values())))
        return MatchResult(len(chain) * self.block_size, self._slots_of(chain), tuple(chain))

    def lookup(self, prompt: RadixKey) -> MatchResult:
        """vLLM's get_computed_blocks: the last prompt token is always recomputed, so a full
        hit is capped at len - 1 and then rounded down to a whole block."""
        prompt = as_key(prompt)
        return self.match_prefix(prompt[:max(len(prompt) - 1, 0)])

    def _slots_of(self, chain) -> np.ndarray:
        if not chain:
            return EMPTY_SLOTS
        ids = np.fromiter((b.id for b in chain), dtype=np.int64, count=len(chain))
        return (ids[:, None] * self.block_size + np.arange(self.block_size)).ravel()

    # ---- insert (vLLM's cache_full_blocks) ------------------------------------------------
    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int) -> InsertResult:
        """Register the full blocks of `key`; `slots` must be whole blocks of the pool. A block
        already registered under its own hash counts as cached (prefix_len); a new block whose
        hash another block already has is registered too (a duplicate, as in vLLM). Newly
        registered blocks are unreferenced: they join the free queue's tail, last block first."""
        bs = self.block_size
        nfull = len(key) // bs
        page = slots[:nfull * bs].reshape(nfull, bs)
        ids = page[:, 0] // bs
        if nfull and not ((page[:, 0] % bs == 0).all() and (page == page[:, :1] + np.arange(bs)).all()):
            raise ValueError(f"slots are not whole blocks of {bs} (first: {slots[:bs].tolist()})")
        if len(set(ids.tolist())) != nfull:
            raise ValueError(f"insert lists block {_first_repeat(ids)} twice")
        hashes = self.block_hashes(key)
        for bid, h in zip(ids.tolist(), hashes):          # validate before any change
            b = self.blocks.get(bid)
            if b is not None and b.hash != h:
                raise ValueError(f"block {bid} is already registered with other content")
        prefix_blocks, new, parent = 0, [], None
        for i, (bid, h) in enumerate(zip(ids.tolist(), hashes)):
            b = self.blocks.get(bid)
            if b is None:
                b = Block(bid, h, parent)
                self.blocks[bid] = b
                same = self.by_hash.setdefault(h, {})
                self.duplicate_blocks += bool(same)
                same[bid] = b
                new.append(b)
                if self.enable_events:
                    toks = tuple(key[i * bs:(i + 1) * bs])
                    self._events.append(KVEvent("stored", h, parent, toks, key.namespace))
            elif not new:
                prefix_blocks = i + 1
            parent = h
        for b in reversed(new):
            self.free_queue[b.id] = b
        self.peak_blocks = max(self.peak_blocks, len(self.blocks))
        return InsertResult(prefix_blocks * bs, tuple(self.blocks[b] for b in ids.tolist()))

    # ---- evict ----------------------------------------------------------------------------
    def _evict(self, num_tokens: int) -> np.ndarray:
        out = []
        while len(out) * self.block_size < num_tokens and self.free_queue:
            _, b = self.free_queue.popitem(last=False)
            del self.blocks[b.id]
            same = self.by_hash[b.hash]
            del same[b.id]
            if not same:
                del self.by_hash[b.hash]
            if self.enable_events:
                self._events.append(KVEvent("removed", b.hash))
            out.append(b)
        return self._slots_of(out)

    # ---- reference counts -----------------------------------------------------------------
    def _inc_lock(self, chain) -> None:
        for b in chain or ():
            if b.ref_cnt == 0:
                del self.free_queue[b.id]
            b.ref_cnt += 1

    def _check_locked(self, chain) -> None:
        uses: dict[int, int] = {}
        for b in chain or ():                             # a block listed k times needs k refs
            uses[b.id] = uses.get(b.id, 0) + 1
            if b.ref_cnt < uses[b.id]:
                raise ValueError(f"dec_lock_ref on unreferenced {b!r}")

    def _dec_lock(self, chain) -> None:
        for b in reversed(chain or ()):                         # last block reaches the tail first
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.free_queue[b.id] = b

    def _check_handle(self, chain) -> None:
        if chain is None:
            return
        if not isinstance(chain, tuple) or not all(isinstance(b, Block) for b in chain):
            raise TypeError(f"expected a tuple of Blocks from match_prefix, got {chain!r}")
        for b in chain:
            if self.blocks.get(b.id) is not b:
                raise ValueError(f"{b!r} is no longer cached (evicted or foreign)")

    # ---- sizes and stats ------------------------------------------------------------------
    def evictable_size(self) -> int:
        return len(self.free_queue) * self.block_size

    def protected_size(self) -> int:
        return (len(self.blocks) - len(self.free_queue)) * self.block_size

    def num_blocks(self) -> int:
        return len(self.blocks)

    num_entries = num_blocks

    @classmethod
    def describe(cls, page_size: int, eviction: str, hash_algo: str) -> str:
        return f"blockhash b{page_size} {hash_algo}"

    @property
    def label(self) -> str:
        return self.describe(self.block_size, "lru", self.hash_algo)

    def stats(self) -> dict[str, int]:
        return {"orphan_blocks": self.orphan_blocks(), "duplicate_blocks": self.duplicate_blocks}

    def orphan_blocks(self) -> int:
        """Cached blocks whose parent block is gone: unreachable until the parent returns."""
        return sum(1 for b in self.blocks.values()
                   if b.parent_hash is not None and b.parent_hash not in self.by_hash)

    def free_queue_ids(self) -> list[int]:
        return list(self.free_queue)

    def held_slots(self) -> Iterable[np.ndarray]:
        return [self._slots_of(list(self.blocks.values()))]

    def take_events(self) -> list[KVEvent]:
        ev, self._events = self._events, []
        return ev

    def check_invariants(self) -> None:
        for bid, b in self.blocks.items():
            assert b.id == bid, f"block stored under id {bid} says {b.id}"
            assert b.ref_cnt >= 0, f"{b!r} has a negative ref count"
            assert (b.ref_cnt == 0) == (bid in self.free_queue), \
                f"{b!r}: in free queue={bid in self.free_queue} but ref_cnt={b.ref_cnt}"
            assert self.by_hash.get(b.hash, {}).get(bid) is b, f"{b!r} missing from the hash index"
        n = sum(len(v) for v in self.by_hash.values())
        assert n == len(self.blocks), f"hash index holds {n} blocks, registry {len(self.blocks)}"
        assert all(v for v in self.by_hash.values()), "an empty hash bucket was kept"
