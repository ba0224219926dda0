"""radixkv.argcheck: each rule accepts what it should, returns it normalised, and rejects the
rest with one exact message naming the value."""
from __future__ import annotations

import math

import numpy as np
import pytest

from radixkv import argcheck as v


def _message(fn, *args) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args)
    return str(e.value)


@pytest.mark.parametrize("x, want", [
    (0, True), (-3, True), (2**70, True), (np.int64(5), True), (np.uint8(1), True),
    (True, False), (np.bool_(True), False), (1.0, False), (np.float64(1.0), False),
    ("1", False), (None, False),
])
def test_is_int(x, want):
    assert v.is_int(x) is want


@pytest.mark.parametrize("x, want", [
    (0, True), (-2.5, True), (math.inf, True), (math.nan, True), (np.int32(3), True),
    (np.float32(0.5), True), (True, False), (np.bool_(False), False), ("1", False),
    (None, False), (1j, False),
])
def test_is_number(x, want):
    assert v.is_number(x) is want


def test_int_at_least():
    assert v.int_at_least(0, "n") == 0
    assert v.int_at_least(7, "n", 7) == 7
    out = v.int_at_least(np.int64(3), "n", 1)
    assert out == 3 and type(out) is int
    assert _message(v.int_at_least, -1, "n") == "n must be an int >= 0, got -1"
    assert _message(v.int_at_least, 1, "n", 2) == "n must be an int >= 2, got 1"
    assert _message(v.int_at_least, True, "n", 1) == "n must be an int >= 1, got True"
    assert _message(v.int_at_least, 2.0, "n") == "n must be an int >= 0, got 2.0"
    zero = np.int64(0)
    assert _message(v.int_at_least, zero, "n", 1) == f"n must be an int >= 1, got {zero!r}"
    flag = np.bool_(True)
    assert _message(v.int_at_least, flag, "n") == f"n must be an int >= 0, got {flag!r}"


def test_count():
    assert v.count(0, "evict") == 0
    out = v.count(np.int32(4), "alloc")
    assert out == 4 and type(out) is int
    assert _message(v.count, -1, "alloc") == "alloc needs a non-negative int, got -1"
    assert _message(v.count, False, "alloc") == "alloc needs a non-negative int, got False"
    assert _message(v.count, "3", "alloc") == "alloc needs a non-negative int, got '3'"
    assert _message(v.count, None, "evict") == "evict needs a non-negative int, got None"


def test_positive_int():
    assert v.positive_int(1, "page_size") == 1
    out = v.positive_int(np.int64(16), "page_size")
    assert out == 16 and type(out) is int
    assert _message(v.positive_int, 0, "page_size") == "page_size must be a positive int, got 0"
    assert _message(v.positive_int, True, "tp") == "tp must be a positive int, got True"
    assert _message(v.positive_int, 1.5, "tp") == "tp must be a positive int, got 1.5"


def test_an_int():
    assert v.an_int(-5, "priority") == -5
    out = v.an_int(np.int16(2), "priority")
    assert out == 2 and type(out) is int
    assert _message(v.an_int, True, "priority") == "priority must be an int, got True"
    assert _message(v.an_int, "high", "priority") == "priority must be an int, got 'high'"
    assert _message(v.an_int, 1.0, "priority") == "priority must be an int, got 1.0"


def test_finite_at_least():
    assert v.finite_at_least(0, "tpot") == 0.0
    out = v.finite_at_least(np.int64(2), "tpot")
    assert out == 2.0 and type(out) is float
    assert v.finite_at_least(np.float32(0.5), "t", 0.5) == 0.5
    assert v.finite_at_least(2**70, "t") == float(2**70)
    assert _message(v.finite_at_least, -0.5, "temperature") == \
        "temperature must be a finite number >= 0, got -0.5"
    assert _message(v.finite_at_least, 1, "x", 1.5) == "x must be a finite number >= 1.5, got 1"
    assert _message(v.finite_at_least, math.inf, "x") == "x must be a finite number >= 0, got inf"
    assert _message(v.finite_at_least, math.nan, "x") == "x must be a finite number >= 0, got nan"
    assert _message(v.finite_at_least, 10**400, "x") == f"x must be a finite number >= 0, got {10**400}"
    assert _message(v.finite_at_least, True, "x") == "x must be a finite number >= 0, got True"
    flag = np.bool_(True)
    assert _message(v.finite_at_least, flag, "x") == f"x must be a finite number >= 0, got {flag!r}"
    assert _message(v.finite_at_least, "1", "x") == "x must be a finite number >= 0, got '1'"


def test_positive_number():
    assert v.positive_number(3, "rate") == 3.0
    out = v.positive_number(np.int64(2), "rate")
    assert out == 2.0 and type(out) is float
    assert v.positive_number(1e-9, "rate") == 1e-9
    for bad, shown in [(0, "0"), (-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan"),
                       (True, "True"), (None, "None")]:
        assert _message(v.positive_number, bad, "GPUSpec.hbm_bytes") == \
            f"GPUSpec.hbm_bytes must be a positive number, got {shown}"


def test_finite_time():
    assert v.finite_time(0, "arrival") == 0.0
    out = v.finite_time(np.float32(1.5), "arrival")
    assert out == 1.5 and type(out) is float
    assert type(v.finite_time(np.int64(4), "ttl")) is float
    for bad, shown in [(-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan"), (True, "True"),
                       ("0", "'0'")]:
        assert _message(v.finite_time, bad, "arrival") == \
            f"arrival must be a finite time >= 0 (seconds), got {shown}"


def test_fraction():
    assert v.fraction(0, "f") == 0.0 and v.fraction(1, "f") == 1.0
    out = v.fraction(np.float32(0.25), "f")
    assert out == 0.25 and type(out) is float
    for bad, shown in [(-0.1, "-0.1"), (1.5, "1.5"), (math.nan, "nan"), (True, "True"),
                       ("0.5", "'0.5'")]:
        assert _message(v.fraction, bad, "f") == f"f must be in [0, 1], got {shown}"


def test_positive_fraction():
    assert v.positive_fraction(1, "top_p") == 1.0
    out = v.positive_fraction(np.float64(0.9), "mem_fraction")
    assert out == 0.9 and type(out) is float
    for bad, shown in [(0, "0"), (0.0, "0.0"), (1.01, "1.01"), (math.nan, "nan"), (True, "True"),
                       (None, "None")]:
        assert _message(v.positive_fraction, bad, "top_p") == f"top_p must be in (0, 1], got {shown}"


def test_optional_str():
    assert v.optional_str(None, "extra_key") is None
    assert v.optional_str("lora", "extra_key") == "lora"
    assert _message(v.optional_str, 5, "extra_key") == "extra_key must be a str or None, got 5"
    assert _message(v.optional_str, b"x", "cache_salt") == "cache_salt must be a str or None, got b'x'"


def test_choice():
    assert v.choice("lru", "eviction policy", ["lru", "fifo"]) == "lru"
    assert v.choice("b", "x", iter(["a", "b"])) == "b"
    assert _message(v.choice, "lruu", "eviction policy", ("lru", "fifo")) == \
        "unknown eviction policy 'lruu'; valid: lru, fifo"
    assert _message(v.choice, 1, "cache", ["radix"]) == "unknown cache 1; valid: radix"
