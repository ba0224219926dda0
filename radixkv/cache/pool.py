"""SlotPool: the single owner of free KV slot indices.

Caches never free memory: they return slot arrays, and whoever holds them gives them back
here. That makes slot conservation checkable in one place (`check_conservation`).
"""
from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from radixkv.argcheck import count, is_int, positive_int

SLOT_DTYPE = np.int64
_SMALL = 64                 # free() batches up to this size take the plain-Python path
EMPTY_SLOTS = np.empty(0, dtype=SLOT_DTYPE)
EMPTY_SLOTS.flags.writeable = False


_ROWS: dict[int, np.ndarray] = {}   # page size -> its pages' slots, one row per page id
_ROWS_CAP = 1 << 22                 # slots a table covers at most (32 MiB); past it, arithmetic


def page_slots(pages: np.ndarray, page_size: int) -> np.ndarray:
    """The slots of whole pages (ids >= 0), in order: page p holds p * page_size and the
    page_size - 1 slots after it. Rows are copied out of a table grown on demand, which beats
    broadcasting a page's offsets across every page."""
    rows = _ROWS.get(page_size)
    if rows is not None:
        try:
            return rows.take(pages, 0).ravel()
        except IndexError:                    # a page past the table
            pass
    need = int(pages.max()) + 1 if len(pages) else 0
    if need * page_size > _ROWS_CAP:
        return ((pages * page_size)[:, None] + np.arange(page_size, dtype=SLOT_DTYPE)).ravel()
    n = min(max(need, 2 * len(rows) if rows is not None else 1024), _ROWS_CAP // page_size)
    rows = _ROWS[page_size] = np.arange(n * page_size, dtype=SLOT_DTYPE).reshape(n, page_size)
    return rows.take(pages, 0).ravel()


def round_up(n: int, page: int) -> int:
    """n rounded up to whole pages."""
    return -(-n // page) * page


def host_memory_bytes() -> int:
    """Physical memory available now (what a new allocation can still get)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):     # no sysconf here: do not guess, allow
        return 1 << 62


class OutOfSlotsError(RuntimeError):
    """Raised by SlotPool.alloc when fewer slots are free than asked for."""


def as_slots(slots) -> np.ndarray:
    """Validate a slot sequence into a 1-D int64 array (ValueError names a bad value)."""
    arr = np.asarray(slots)
    if arr.size == 0:
        return EMPTY_SLOTS
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"slots must be a 1-D sequence of ints, got dtype {arr.dtype} shape {arr.shape}")
    return arr.astype(SLOT_DTYPE, copy=False)


class SlotPool:
    """`num_slots` KV slots handed out in pages of `page_size` (a page is contiguous)."""

    def __init__(self, num_slots: int, page_size: int = 1):
        page_size = positive_int(page_size, "page_size")
        if not is_int(num_slots) or num_slots < page_size or num_slots % page_size:
            raise ValueError(f"num_slots must be a positive multiple of page_size {page_size}, "
                             f"got {num_slots!r}")
        self.num_slots, self.page_size = int(num_slots), page_size
        self.num_pages = num_slots // page_size
        self._offsets = np.arange(page_size, dtype=SLOT_DTYPE)     # a page's slots past its first
        need, have = self.num_slots + 8 * self.num_pages, host_memory_bytes()
        if need > have:                            # refuse before allocating, not MemoryError
            raise ValueError(f"a KV pool of {self.num_slots:,} slots needs {need / 2**30:,.1f} GiB "
                             f"of host memory for its slot bookkeeping; this machine has "
                             f"{have / 2**30:,.1f} GiB available")
        self.reset()

    def reset(self) -> None:
        # free pages as a stack: the top is the end; low page ids are handed out first, and
        # pages freed together come back in the order they were freed
        self._free = np.arange(self.num_pages - 1, -1, -1, dtype=SLOT_DTYPE)
        self._top = self.num_pages
        self._in_use = np.zeros(self.num_slots, dtype=bool)      # per slot: handed out

    def _push(self, pages) -> None:
        # reversed, so alloc (which reads the top downwards) hands a freed run back in the
        # order it was freed: an ascending run stays ascending, a contiguous gather
        n = len(pages)
        self._free[self._top:self._top + n] = pages[::-1]
        self._top += n

    def available(self) -> int:
        """Free slots (always whole pages)."""
        return self._top * self.page_size

    def used(self) -> int:
        return self.num_slots - self.available()

    def alloc(self, n: int) -> np.ndarray:
        """Hand out ceil(n / page_size) whole pages: an int64 array of that many * page_size slots."""
        if type(n) is not int or n < 0:     # plain ints skip the call; count() judges the rest
            n = count(n, "alloc")
        pages = -(-int(n) // self.page_size)
        if pages > self._top:
            raise OutOfSlotsError(f"asked for {n} slots ({pages} pages of {self.page_size}); "
                                  f"only {self.available()} of {self.num_slots} are free")
        if pages == 0:
            return EMPTY_SLOTS
        page_ids = self._free[self._top - pages:self._top][::-1]
        self._top -= pages
        if self.page_size == 1:
            slots = page_ids.copy()
        else:
            slots = page_slots(page_ids, self.page_size)
        self._in_use[slots] = True
        return slots

    def free(self, slots: Iterable[int]) -> None:
        """Take slots back. A double free, a foreign slot or a partial page raises and frees
        nothing. A few slots are checked in plain Python, a batch small beside the pool by one
        sort, a large one (evictions) by O(num_slots / 8) vectorised scans, where a sort would
        dominate."""
        arr = as_slots(slots)
        if arr.size == 0:
            return
        if arr.size <= _SMALL:                     # a page's tail: plain Python beats numpy calls
            return self._free_small(arr)
        if arr.min() < 0 or arr.max() >= self.num_slots:
            bad = arr[(arr < 0) | (arr >= self.num_slots)][0]
            raise ValueError(f"slot {int(bad)} does not belong to this pool of {self.num_slots}")
        if not self._in_use[arr].all():
            bad = arr[~self._in_use[arr]][0]
            raise ValueError(f"double free: slot {int(bad)} is not allocated")
        if arr.size * 64 < self.num_slots:         # sort a small batch, scan the pool for a big one
            return self._free_sorted(arr)
        used_before = self.num_slots - self.available()
        self._in_use[arr] = False
        if np.count_nonzero(self._in_use) != used_before - arr.size:
            self._in_use[arr] = True
            raise ValueError(f"slot {int(_first_dup(arr))} appears twice in one free")
        ps = self.page_size
        if ps == 1:
            pages = arr
        else:
            touched = np.zeros(self.num_pages, dtype=bool)
            touched[arr // ps] = True
            pages = np.flatnonzero(touched)
            if self._in_use.reshape(-1, ps)[pages].any():
                self._in_use[arr] = True
                raise ValueError(f"free of {arr.size} slots does not cover whole pages of {ps}")
        self._push(pages)

    def release(self, slots: np.ndarray) -> None:
        """free() without its checks, for slots a cache just evicted: the caller guarantees
        they are handed out, distinct and whole pages (`check_conservation` verifies it). The
        free stack gets the pages free() would give it, in the same order."""
        if not len(slots):
            return
        ps = self.page_size
        if ps == 1:
            pages = slots
        else:
            pages = slots[::ps] // ps                 # a new array: sorted in place
            pages.sort()
        self._in_use[slots] = False
        self._push(pages)

    def _free_small(self, arr: np.ndarray) -> None:
        """free() of at most _SMALL slots: the same checks, messages and page order."""
        items = arr.tolist()
        if min(items) < 0 or max(items) >= self.num_slots:
            bad = next(x for x in items if x < 0 or x >= self.num_slots)
            raise ValueError(f"slot {bad} does not belong to this pool of {self.num_slots}")
        in_use = self._in_use
        if not in_use[arr].all():
            bad = arr[~in_use[arr]][0]
            raise ValueError(f"double free: slot {int(bad)} is not allocated")
        if len(set(items)) != len(items):
            raise ValueError(f"slot {int(_first_dup(arr))} appears twice in one free")
        ps = self.page_size
        pages = items if ps == 1 else sorted({x // ps for x in items})
        if len(pages) * ps != len(items):         # no duplicates here, so this means a partial page
            raise ValueError(f"free of {arr.size} slots does not cover whole pages of {ps}")
        in_use[arr] = False
        self._push(pages)

    def _free_sorted(self, arr: np.ndarray) -> None:
        """free() of a batch small beside the pool: duplicates and whole pages read off one sort."""
        ps, s = self.page_size, np.sort(arr)
        if (s[1:] == s[:-1]).any():
            raise ValueError(f"slot {int(_first_dup(arr))} appears twice in one free")
        if ps == 1:
            pages = arr
        else:
            pages = s[::ps] // ps                 # sorted, no duplicates: whole pages are runs
            if s.size % ps or not (s.reshape(-1, ps) - (pages * ps)[:, None] == self._offsets).all():
                raise ValueError(f"free of {arr.size} slots does not cover whole pages of {ps}")
        self._in_use[arr] = False
        self._push(pages)

    def check_conservation(self, held: Iterable[Iterable[int]] = ()) -> None:
        """Every slot is free here or held by exactly one holder in `held` (tree, requests)."""
        count = np.zeros(self.num_slots, dtype=np.int64)
        for h in held:
            arr = as_slots(h)
            if arr.size:
                np.add.at(count, arr, 1)
        free_mask = ~self._in_use
        twice = np.flatnonzero(count > 1)
        if twice.size:
            raise AssertionError(f"slot {int(twice[0])} is held {int(count[twice[0]])} times")
        both = np.flatnonzero(free_mask & (count > 0))
        if both.size:
            raise AssertionError(f"slot {int(both[0])} is free in the pool and also held")
        lost = np.flatnonzero(~free_mask & (count == 0))
        if lost.size:
            raise AssertionError(f"slot {int(lost[0])} leaked: allocated but held by nobody")
        free_pages = self._free[:self._top]
        if np.unique(free_pages).size != free_pages.size:
            raise AssertionError("a page is on the free stack twice")
        if free_pages.size * self.page_size != int(free_mask.sum()):
            raise AssertionError("free stack and per-slot state disagree")


def _first_dup(arr: np.ndarray) -> int:
    s = np.sort(arr)
    return s[np.flatnonzero(s[1:] == s[:-1])[0]]
