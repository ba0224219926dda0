"""RadixKey: packing, slicing, namespaces, page-aligned matching, first divergence."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.cache.key import RadixKey, first_divergence, pack_tokens


def test_len_iter_index():
    k = RadixKey([5, 6, 7, 8, 9])
    assert len(k) == 5
    assert list(k) == [5, 6, 7, 8, 9]
    assert k.tokens == [5, 6, 7, 8, 9]
    assert k[0] == 5 and k[-1] == 9
    assert k.numpy().tolist() == [5, 6, 7, 8, 9]
    assert len(RadixKey()) == 0 and list(RadixKey()) == []


def test_slice_keeps_namespace():
    k = RadixKey(range(10), extra_key="lora-7", cache_salt="user-1")
    s = k[2:5]
    assert isinstance(s, RadixKey)
    assert s.tokens == [2, 3, 4]
    assert s.namespace == ("lora-7", "user-1")
    assert s.extra_key == "lora-7" and s.cache_salt == "user-1"
    assert k[7:].tokens == [7, 8, 9] and k[7:].namespace == k.namespace
    assert k[:-8].tokens == [0, 1]
    assert len(k[5:2]) == 0 and k[5:2].namespace == k.namespace
    assert s == RadixKey([2, 3, 4], extra_key="lora-7", cache_salt="user-1")
    assert s != RadixKey([2, 3, 4])
    with pytest.raises(ValueError, match="step 1"):
        k[::2]


def test_add_and_hash():
    a = RadixKey([1, 2], extra_key="x")
    assert (a + [3]).tokens == [1, 2, 3] and (a + [3]).namespace == ("x", None)
    assert (a + RadixKey([4], extra_key="x")).tokens == [1, 2, 4]
    with pytest.raises(ValueError, match="namespaces"):
        a + RadixKey([4])
    assert hash(RadixKey([1, 2], extra_key="x")) == hash(a)
    assert {a: 1}[RadixKey([1, 2], extra_key="x")] == 1


@pytest.mark.parametrize("page_size, expected", [(1, 7), (2, 6), (3, 6), (4, 4), (7, 7), (8, 0)])
def test_match_rounds_down_to_pages(page_size, expected):
    a = RadixKey([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = RadixKey([0, 1, 2, 3, 4, 5, 6, 99, 8, 9])
    assert a.match(b, page_size) == expected
    assert b.match(a, page_size) == expected


def test_match_prefix_of_other_and_identical():
    a = RadixKey(range(10))
    assert a.match(RadixKey(range(6))) == 6
    assert a.match(RadixKey(range(6)), 4) == 4
    assert a.match(RadixKey(range(10)), 4) == 8
    assert a.match(RadixKey(range(10))) == 10
    assert a.match(RadixKey()) == 0
    assert a.match(RadixKey([1])) == 0


@pytest.mark.parametrize("ns_a, ns_b", [
    ((None, None), ("lora", None)),
    ((None, None), (None, "salt")),
    (("bc", "a"), ("c", "ab")),
    (("x", None), (None, "x")),
])
def test_match_namespaces_differ_raises(ns_a, ns_b):
    a = RadixKey([1, 2, 3], extra_key=ns_a[0], cache_salt=ns_a[1])
    b = RadixKey([1, 2, 3], extra_key=ns_b[0], cache_salt=ns_b[1])
    with pytest.raises(ValueError, match="namespaces differ"):
        a.match(b)
    assert a != b


def test_match_needs_a_key():
    with pytest.raises(TypeError, match="list"):
        RadixKey([1]).match([1])


def test_long_common_prefix_100k():
    base = np.arange(100_000, dtype=np.int64) * 7 % 50_000
    a = RadixKey(base)
    assert a.match(RadixKey(base)) == 100_000
    assert a.match(RadixKey(np.concatenate([base, [1, 2, 3]]))) == 100_000
    for pos in (0, 1, 255, 256, 257, 4096, 50_001, 99_999):
        b = base.copy()
        b[pos] = 60_000
        assert a.match(RadixKey(b)) == pos
        assert a.match(RadixKey(b), 16) == pos - pos % 16
        assert a.match(RadixKey(b), 64) == pos - pos % 64


def _naive_div(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# lengths up to 256 tokens take the big-int XOR path, longer ones the vectorised path
@pytest.mark.parametrize("length", [1, 2, 3, 10, 255, 256, 257, 300, 5000])
def test_first_divergence_positions(length):
    base = [(i * 2654435761) % (2**32) for i in range(length)]
    pa = pack_tokens(base)
    assert first_divergence(pa, pa) == length
    positions = sorted({0, 1, length // 2, length - 2, length - 1} & set(range(length)))
    for pos in positions:
        for delta in (1, 1 << 8, 1 << 16, 1 << 24, 1 << 31):   # differ in each byte of the token
            b = list(base)
            b[pos] = base[pos] ^ delta
            pb = pack_tokens(b)
            assert first_divergence(pa, pb) == pos == _naive_div(base, b)
            assert first_divergence(pb, pa) == pos
            # a difference after the first one does not matter
            if pos + 1 < length:
                b[-1] ^= 5
                assert first_divergence(pa, pack_tokens(b)) == pos


@pytest.mark.parametrize("short, long_", [(10, 20), (256, 300), (300, 301), (1000, 4000)])
def test_first_divergence_prefix_of_longer(short, long_):
    big = list(range(1, long_ + 1))
    assert first_divergence(pack_tokens(big[:short]), pack_tokens(big)) == short
    assert first_divergence(pack_tokens(big), pack_tokens(big[:short])) == short
    other = big[:short - 1] + [0] + big[short:]
    assert first_divergence(pack_tokens(big), pack_tokens(other)) == short - 1


def test_max_token_accepted():
    k = RadixKey([0, 2**32 - 1])
    assert k.tokens == [0, 2**32 - 1]
    assert RadixKey(np.array([2**32 - 1], dtype=np.uint64)).tokens == [2**32 - 1]
    assert RadixKey([np.int64(3), np.uint32(4)]).tokens == [3, 4]


@pytest.mark.parametrize("bad, shown", [
    (-1, r"-1\b"),
    (-(2**40), str(-(2**40))),
    (1.5, r"1\.5"),
    (2.0, r"2\.0"),
    ("7", r"'7'"),
    (None, "None"),
    (2**32, "4294967296"),
    (2**64, str(2**64)),
])
def test_bad_tokens_raise_naming_value(bad, shown):
    with pytest.raises(ValueError, match=rf"token id {shown}"):
        RadixKey([3, 4, bad, 5])


@pytest.mark.parametrize("arr, shown", [
    (np.array([1, -3, 2]), "token id -3"),
    (np.array([1, 2**33], dtype=np.int64), f"token id {2**33}"),
    (np.array([1.0, 2.0]), "float64"),
    (np.array([[1, 2]]), r"\(1, 2\)"),
    (np.array([True]), "bool"),
])
def test_bad_numpy_tokens_raise(arr, shown):
    with pytest.raises(ValueError, match=shown):
        RadixKey(arr)


def test_bad_namespace_and_bytes():
    with pytest.raises(ValueError, match="extra_key must be a str or None, got 5"):
        RadixKey([1], extra_key=5)
    with pytest.raises(ValueError, match=r"cache_salt must be a str or None, got b'x'"):
        RadixKey([1], cache_salt=b"x")
    with pytest.raises(TypeError, match="not bytes"):
        RadixKey(b"\x01\x00\x00\x00")


def test_regression_generator_bad_token_raises_valueerror():
    # a one-shot iterator used to be consumed by the fast path, so the slow path could not name
    # the bad value and an OverflowError/TypeError escaped instead of the documented ValueError
    with pytest.raises(ValueError, match="token id -1 is out of range"):
        RadixKey(t for t in [1, 2, -1])
    with pytest.raises(ValueError, match=r"token id 2\.5 is not an int"):
        RadixKey(iter([1, 2.5]))
    assert RadixKey(t for t in [1, 2, 3]).tokens == [1, 2, 3]


@pytest.mark.parametrize("n, page_size, start, stop", [(1, 1, 0, 0), (10, 1, 0, 10), (10, 3, 0, 3),
                                                       (10, 3, 1, 3), (64, 16, 2, 4), (5, 8, 0, 0)])
def test_pages_is_the_list_of_page(n, page_size, start, stop):
    k = RadixKey(list(range(n)), "lora", "salt")
    assert k.pages(start, stop, page_size) == [k.page(i, page_size) for i in range(start, stop)]
    assert all(len(p) == page_size * 4 for p in k.pages(start, stop, page_size))
