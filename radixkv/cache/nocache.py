"""NoCache: the control. Same interface, caches nothing: every request prefills everything."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from radixkv.cache.base import InsertResult, MatchResult, PrefixCache
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import EMPTY_SLOTS


class NoCache(PrefixCache[None]):
    name = "none"
    shares_prefixes = False          # the CacheManager keeps every slot with its request

    def __init__(self, page_size: int = 1):
        super().__init__(page_size)

    def reset(self) -> None:
        return None

    def _match(self, key: RadixKey, split: bool) -> MatchResult:
        return MatchResult(0, EMPTY_SLOTS, None)

    def _insert(self, key: RadixKey, slots: np.ndarray, priority: int, tag=None
                ) -> InsertResult:
        # nothing is stored: report every whole page as "already cached" so the caller frees it
        return InsertResult(len(key) - len(key) % self.page_size, None)

    def _evict(self, num_tokens: int) -> np.ndarray:
        return EMPTY_SLOTS

    def _check_handle(self, node) -> None:
        if node is not None:
            raise ValueError(f"NoCache holds no nodes, got {node!r}")

    def _check_locked(self, node) -> None:
        return None                  # None is the only handle, and it always "unlocks"

    def _inc_lock(self, node) -> None:
        return None

    def _dec_lock(self, node) -> None:
        return None

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def held_slots(self) -> Iterable[np.ndarray]:
        return []

    def _check_structure(self) -> None:
        return None                  # nothing is held: nothing can be inconsistent

    def _locks_held(self) -> int:
        return 0

    def _lock_units(self, node) -> int:
        return 0

    def num_entries(self) -> int:
        return 0
