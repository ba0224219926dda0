"""Validation rules, each written once.

The boundaries — config dataclasses, `TraceRequest`, `Request`, the cache contract
(`PrefixCache`'s public methods), the pool and the command line — call these, so a rule and its
message live in one place. Each returns the checked value or raises ValueError naming `what`
and the value. A leaf module: it imports nothing from radixkv.
"""
from __future__ import annotations

import math
from typing import Iterable

import numpy as np


def is_int(v) -> bool:
    """A real integer (a Python or numpy int), never a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_number(v) -> bool:
    """A real number (a Python or numpy int or float), never a bool."""
    return isinstance(v, (int, float, np.integer, np.floating)) \
        and not isinstance(v, (bool, np.bool_))


def _finite(v) -> bool:
    try:
        return is_number(v) and math.isfinite(v)
    except OverflowError:           # an int beyond float range
        return False


def int_at_least(v, what: str, lo: int = 0) -> int:
    if not is_int(v) or v < lo:
        raise ValueError(f"{what} must be an int >= {lo}, got {v!r}")
    return int(v)


def count(v, what: str) -> int:
    """A size an operation is asked for (tokens to evict, slots to allocate)."""
    if not is_int(v) or v < 0:
        raise ValueError(f"{what} needs a non-negative int, got {v!r}")
    return int(v)


def positive_int(v, what: str) -> int:
    if not is_int(v) or v < 1:
        raise ValueError(f"{what} must be a positive int, got {v!r}")
    return int(v)


def an_int(v, what: str) -> int:
    if not is_int(v):
        raise ValueError(f"{what} must be an int, got {v!r}")
    return int(v)


def finite_at_least(v, what: str, lo: float = 0) -> float:
    if not _finite(v) or v < lo:
        raise ValueError(f"{what} must be a finite number >= {lo}, got {v!r}")
    return float(v)


def positive_number(v, what: str) -> float:
    """A finite number > 0 (rates, hardware peaks)."""
    if not _finite(v) or v <= 0:
        raise ValueError(f"{what} must be a positive number, got {v!r}")
    return float(v)


def finite_time(v, what: str) -> float:
    """A finite number of seconds >= 0 (arrival times, TTLs)."""
    if not _finite(v) or v < 0:
        raise ValueError(f"{what} must be a finite time >= 0 (seconds), got {v!r}")
    return float(v)


def fraction(v, what: str) -> float:
    if not is_number(v) or not 0 <= v <= 1:
        raise ValueError(f"{what} must be in [0, 1], got {v!r}")
    return float(v)


def positive_fraction(v, what: str) -> float:
    """A share that may not be zero (nucleus mass, memory fraction)."""
    if not is_number(v) or not 0 < v <= 1:
        raise ValueError(f"{what} must be in (0, 1], got {v!r}")
    return float(v)


def optional_str(v, what: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise ValueError(f"{what} must be a str or None, got {v!r}")
    return v


def choice(v, what: str, valid: Iterable[str]) -> str:
    valid = list(valid)
    if not isinstance(v, str) or v not in valid:
        raise ValueError(f"unknown {what} {v!r}; valid: {', '.join(valid)}")
    return v
