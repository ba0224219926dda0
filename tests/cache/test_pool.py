"""SlotPool: whole-page allocation, validated frees that change nothing on error, conservation."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache.pool import OutOfSlotsError, SlotPool, as_slots


def test_alloc_whole_pages_page1():
    pool = SlotPool(8)
    a = pool.alloc(3)
    assert a.dtype == np.int64 and a.tolist() == [0, 1, 2]
    assert pool.available() == 5 and pool.used() == 3
    assert pool.alloc(0).size == 0 and pool.available() == 5


def test_alloc_whole_pages_page4():
    pool = SlotPool(32, page_size=4)
    a = pool.alloc(5)                       # ceil(5/4) = 2 pages
    assert a.tolist() == list(range(8))
    b = pool.alloc(4)
    assert b.tolist() == [8, 9, 10, 11]
    c = pool.alloc(1)
    assert c.tolist() == [12, 13, 14, 15]
    assert pool.available() == 16 and pool.used() == 16
    pool.check_conservation([a, b, c])


def test_free_returns_pages_and_they_are_reused():
    pool = SlotPool(16, page_size=4)
    a = pool.alloc(8)
    b = pool.alloc(8)
    assert pool.available() == 0
    pool.free(a)
    assert pool.available() == 8
    pool.check_conservation([b])
    again = pool.alloc(8)
    assert sorted(again.tolist()) == list(range(8))
    assert pool.available() == 0
    pool.free(np.concatenate([b[4:], again, b[:4]]))       # any order, whole pages
    assert pool.available() == 16
    pool.check_conservation([])


@pytest.mark.parametrize("how", ["free", "free_small", "release"])
def test_regression_a_freed_run_comes_back_in_its_own_order(how):
    """A run freed ascending is handed out ascending again (it used to come back reversed, and
    a descending gather of the same slots cost the CPU executor up to twice as much)."""
    pool = SlotPool(4096)
    held = pool.alloc(200 if how != "free_small" else 40)
    rest = pool.alloc(pool.available())
    getattr(pool, "release" if how == "release" else "free")(held)
    assert pool.alloc(len(held)).tolist() == held.tolist()
    pool.free(rest[:100])
    pool.free(rest[300:400])
    assert pool.alloc(150).tolist() == rest[300:400].tolist() + rest[:50].tolist()


def test_out_of_slots_message_and_nothing_changes():
    pool = SlotPool(8, page_size=4)
    held = pool.alloc(4)
    with pytest.raises(OutOfSlotsError, match=r"asked for 5 slots \(2 pages of 4\); only 4 of 8 are free"):
        pool.alloc(5)
    assert pool.available() == 4
    pool.check_conservation([held])
    assert pool.alloc(4).tolist() == [4, 5, 6, 7]
    with pytest.raises(OutOfSlotsError, match="only 0 of 8 are free"):
        pool.alloc(1)
    assert issubclass(OutOfSlotsError, RuntimeError)


@pytest.mark.parametrize("n", [-1, 1.5, "3", None])
def test_alloc_bad_count(n):
    pool = SlotPool(8)
    with pytest.raises(ValueError, match="alloc needs a non-negative int"):
        pool.alloc(n)
    assert pool.available() == 8


@pytest.mark.parametrize("num, ps", [(10, 4), (0, 1), (2, 4), (8, 0), (8, 1.0), (8.0, 1)])
def test_bad_construction(num, ps):
    with pytest.raises(ValueError, match="num_slots|page_size"):
        SlotPool(num, ps)


# a free of a few slots from a big pool and one from a small pool may take different code paths
POOL_SIZES = [16, 4096]


def _pool_with_allocs(ps, num=16):
    pool = SlotPool(num, page_size=ps)
    a, b = pool.alloc(4), pool.alloc(4)
    return pool, a, b


@pytest.mark.parametrize("num", POOL_SIZES)
@pytest.mark.parametrize("ps", [1, 4])
def test_double_free_raises_and_changes_nothing(ps, num):
    pool, a, b = _pool_with_allocs(ps, num)
    pool.free(a)
    before = pool.available()
    with pytest.raises(ValueError, match=r"double free: slot 0 is not allocated"):
        pool.free(a)
    assert pool.available() == before == num - 4
    # a mix of a held page and a freed one frees neither
    with pytest.raises(ValueError, match="double free"):
        pool.free(np.concatenate([b, a]))
    assert pool.available() == num - 4
    pool.check_conservation([b])


@pytest.mark.parametrize("num", POOL_SIZES)
@pytest.mark.parametrize("foreign", [-1, 4096, 100_000])
def test_foreign_slot_raises_and_changes_nothing(foreign, num):
    pool, a, b = _pool_with_allocs(4, num)
    with pytest.raises(ValueError, match=rf"slot {foreign} does not belong to this pool of {num}"):
        pool.free(list(a) + [foreign])
    assert pool.available() == num - 8
    pool.check_conservation([a, b])


@pytest.mark.parametrize("num", POOL_SIZES)
def test_duplicate_in_one_free_raises_and_changes_nothing(num):
    pool, a, b = _pool_with_allocs(1, num)
    with pytest.raises(ValueError, match="slot 5 appears twice in one free"):
        pool.free([4, 5, 5, 6])
    assert pool.available() == num - 8
    pool.check_conservation([a, b])


@pytest.mark.parametrize("num", POOL_SIZES)
def test_partial_page_free_raises_and_changes_nothing(num):
    pool, a, b = _pool_with_allocs(4, num)
    with pytest.raises(ValueError, match="does not cover whole pages of 4"):
        pool.free(a[:2])
    assert pool.available() == num - 8
    pool.check_conservation([a, b])
    with pytest.raises(ValueError, match="does not cover whole pages of 4"):
        pool.free(np.concatenate([a, b[:3]]))
    assert pool.available() == num - 8
    pool.check_conservation([a, b])
    pool.free(a)
    assert pool.available() == num - 4
    pool.check_conservation([b])


def test_big_batch_free_paths():
    # large frees (a big eviction) and a partial page / duplicate hidden in one
    pool = SlotPool(64, page_size=4)
    s = pool.alloc(64)
    with pytest.raises(ValueError, match="does not cover whole pages of 4"):
        pool.free(s[:63])
    assert pool.available() == 0
    with pytest.raises(ValueError, match=r"slot 9 appears twice in one free"):
        pool.free(np.concatenate([s[:8], s[9:10], s[8:16]]))
    assert pool.available() == 0
    pool.check_conservation([s])
    pool.free(s[:32])
    assert pool.available() == 32
    pool.check_conservation([s[32:]])
    pool.free(s[32:])
    assert pool.available() == 64
    pool.check_conservation([])


def test_free_bad_shapes():
    pool, a, b = _pool_with_allocs(1)
    with pytest.raises(ValueError, match="1-D sequence of ints"):
        pool.free([[0, 1]])
    with pytest.raises(ValueError, match="float64"):
        pool.free([0.0, 1.0])
    pool.free([])                           # empty free is a no-op
    assert pool.available() == 8
    pool.check_conservation([a, b])


def test_as_slots():
    assert as_slots([3, 1]).dtype == np.int64
    assert as_slots([]).size == 0
    assert as_slots(np.array([2], dtype=np.uint32)).tolist() == [2]


def test_conservation_detects_leak():
    pool, a, b = _pool_with_allocs(4)
    pool.check_conservation([a, b])
    with pytest.raises(AssertionError, match=r"slot 4 leaked: allocated but held by nobody"):
        pool.check_conservation([a])
    with pytest.raises(AssertionError, match=r"slot 7 leaked"):
        pool.check_conservation([a, b[:3]])


def test_conservation_detects_double_hold():
    pool, a, b = _pool_with_allocs(4)
    with pytest.raises(AssertionError, match=r"slot 5 is held 2 times"):
        pool.check_conservation([a, b, b[1:2]])
    with pytest.raises(AssertionError, match=r"slot 0 is held 3 times"):
        pool.check_conservation([a, b, a[:1], a[:1]])


def test_conservation_detects_free_and_held():
    pool, a, b = _pool_with_allocs(4)
    pool.free(b)
    with pytest.raises(AssertionError, match=r"slot 4 is free in the pool and also held"):
        pool.check_conservation([a, b])
    with pytest.raises(AssertionError, match=r"slot 12 is free in the pool and also held"):
        pool.check_conservation([a, [12]])
    pool.check_conservation([a])


def test_reset():
    pool, a, b = _pool_with_allocs(4)
    pool.reset()
    assert pool.available() == 16
    pool.check_conservation([])
    assert pool.alloc(4).tolist() == [0, 1, 2, 3]


def test_regression_small_batch_partial_page_free_raises():
    # the sort-based path for small frees (few slots from a big pool) skipped the whole-page
    # check: freeing half a page released the whole page while its other slots were in use
    pool = SlotPool(4096, page_size=4)
    a = pool.alloc(8)
    with pytest.raises(ValueError, match="free of 2 slots does not cover whole pages of 4"):
        pool.free(a[2:4])
    assert pool.available() == 4088
    pool.check_conservation([a])
    with pytest.raises(ValueError, match="free of 6 slots does not cover whole pages of 4"):
        pool.free(a[:6])
    assert pool.available() == 4088
    pool.check_conservation([a])
    assert pool.alloc(4).tolist() == [8, 9, 10, 11]


def test_regression_pool_too_large_for_memory_is_refused_before_allocating():
    # --kv-capacity 1e11 used to end in a MemoryError traceback after a long wait
    from radixkv.cache.pool import host_memory_bytes
    slots = (host_memory_bytes() // 9 + 1) * 16           # 1 byte per slot + 8 per page of 1
    with pytest.raises(ValueError, match=rf"a KV pool of {slots:,} slots needs .* GiB of host memory"):
        SlotPool(slots)
    assert SlotPool(1024).available() == 1024
