"""NoCache: the control. Same interface, caches nothing: every request prefills everything."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from radixkv.cache.base import CacheReq, InsertResult, MatchResult, PrefixCache, as_key
from radixkv.cache.pool import EMPTY_SLOTS, as_slots


class NoCache(PrefixCache):
    def __init__(self, page_size: int = 1, **_ignored):
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size must be a positive int, got {page_size!r}")
        self.page_size = page_size

    def reset(self) -> None:
        return None

    def match_prefix(self, key, split: bool = True) -> MatchResult:
        as_key(key)
        return MatchResult(0, EMPTY_SLOTS, None)

    def insert(self, key, slots, priority: int = 0) -> InsertResult:
        key, slots = as_key(key), as_slots(slots)
        if len(slots) != len(key):
            raise ValueError(f"insert got {len(slots)} slots for {len(key)} tokens")
        # nothing is stored: report every whole page as "already cached" so the caller frees it
        return InsertResult(len(key) - len(key) % self.page_size, None)

    def evict(self, num_tokens: int) -> np.ndarray:
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0:
            raise ValueError(f"evict needs a non-negative int, got {num_tokens!r}")
        return EMPTY_SLOTS

    def inc_lock_ref(self, node) -> None:
        if node is not None:
            raise ValueError(f"NoCache holds no nodes, got {node!r}")

    def dec_lock_ref(self, node) -> None:
        if node is not None:
            raise ValueError(f"NoCache holds no nodes, got {node!r}")

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def held_slots(self) -> Iterable[np.ndarray]:
        return []

    def check_invariants(self) -> None:
        return None

    def cache_unfinished_req(self, req: CacheReq) -> np.ndarray:
        return EMPTY_SLOTS                    # the request keeps all of its slots

    def cache_finished_req(self, req: CacheReq) -> np.ndarray:
        to_free, req.slots, req.cached_len, req.last_node = req.slots, EMPTY_SLOTS, 0, None
        return to_free
