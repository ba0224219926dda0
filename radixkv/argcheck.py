"""Validation rules, each written once.

The boundaries — config dataclasses, `TraceRequest`, `Request`, the cache contract
(`PrefixCache`'s public methods), the pool and the command line — call these, so a rule and its
message live in one place. Each returns the checked value or raises ValueError naming `what`
and the value. A leaf module: it imports nothing from radixkv.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
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


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_CAPACITY = re.compile(r"\s*(\d[\d_,]*(?:\.\d+)?(?:[eE]\+?\d+)?)\s*([A-Za-z]*)\s*")


def parse_capacity(text: str | int, kv_bytes_per_token: int | None = None) -> int:
    """A capacity in tokens from a token count ("3000000", "3_000_000", "3,000,000", "3e6") or a
    byte size ("40GiB", "1.5 TB"; B, KB, MB, GB, TB decimal, KiB..TiB binary), which needs
    `kv_bytes_per_token` (rounded down to whole tokens)."""
    if is_int(text):
        if text < 1:
            raise ValueError(f"capacity must be at least 1 token, got {text!r}")
        return int(text)
    m = _CAPACITY.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(f"bad capacity {text!r}: expected a token count such as 3000000 or "
                         f"a byte size such as 40GiB")
    number, unit = m.group(1).replace("_", "").replace(",", ""), m.group(2).lower()
    if not unit or unit in ("t", "tok", "tokens"):
        count = Decimal(number)
        if count != count.to_integral_value():
            raise ValueError(f"bad capacity {text!r}: a token count must be a whole number")
        tokens = int(count)
    else:
        if unit not in _UNITS:
            raise ValueError(f"bad capacity {text!r}: unknown unit {m.group(2)!r}; valid: B, KB, "
                             f"MB, GB, TB, KiB, MiB, GiB, TiB (or none for tokens)")
        if kv_bytes_per_token is None:
            raise ValueError(f"capacity {text!r} is a byte size: give the KV bytes per token "
                             f"(--kv-bytes-per-token) to turn it into tokens")
        positive_int(kv_bytes_per_token, "kv_bytes_per_token")
        try:
            nbytes = Decimal(number) * _UNITS[unit]
        except InvalidOperation:
            raise ValueError(f"bad capacity {text!r}") from None
        tokens = int(nbytes // kv_bytes_per_token)
    if tokens < 1:
        raise ValueError(f"capacity {text!r} is less than one token"
                         + (f" at {kv_bytes_per_token:,} bytes per token" if unit else ""))
    return tokens


# ---- configuration fields: their rules and their command-line names ---------------------
def fields_at_least(obj, *names: str, lo: int = 1) -> None:
    """Each named field of a config is an int of at least `lo` (its error names Class.field)."""
    for n in names:
        int_at_least(getattr(obj, n), f"{type(obj).__name__}.{n}", lo)


def cli_flag(flag: str, help: str, *aliases: str, **extra) -> dict:
    """Field metadata for radixkv.commands.flags: `aliases` are old spellings (hidden);
    `choices` is "module:NAME" of the registry the value is one of, read for --help only;
    `caches` are the cache kinds a cache option applies to (default: all)."""
    return {"flag": flag, "help": help, "aliases": aliases, **extra}


def field_choice(obj, name: str, kind: str, valid) -> None:
    """A config's field is one of `valid` (its error names Class.field and the valid values)."""
    try:
        choice(getattr(obj, name), kind, valid)
    except ValueError as e:
        raise ValueError(f"{type(obj).__name__}.{name}: {e}") from None
