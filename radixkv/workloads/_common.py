"""Shared pieces of the generators: argument checks, seeded streams, tokens, arrivals.

Every generator draws content (token ids, lengths) and timing (arrivals, think times) from
two separate streams spawned from (seed, generator name). So the same seed gives the same
prompts whatever the rate, and two generators with the same seed do not share tokens.

Before generating, each generator computes from its parameters an upper estimate of its
requests, its total tokens (every prompt and output, plus shared segments) and its largest
request, and `check_budget` refuses sizes over the bounds in `record`.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from radixkv.argcheck import int_at_least, is_int, positive_number

from .record import (MAX_REQUEST_TOKENS, MAX_WORKLOAD_REQUESTS, MAX_WORKLOAD_TOKENS,
                     TOKEN_ID_LIMIT, TraceRequest, Workload)

Range = tuple[int, int]

# Ordering of an offline workload (rate None/inf): the timed schedule at this rate, with
# every arrival then set to 0. Multi-turn conversations thus interleave in the list as they
# would online, instead of one user's turns running back to back.
NOMINAL_RATE = 1.0


def check_range(name: str, value: Any, lo: int = 1) -> Range:
    """An inclusive (low, high) length range, low >= lo."""
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != 2 \
            or not all(map(is_int, value)) or not lo <= value[0] <= value[1]:
        raise ValueError(f"{name} must be an int pair (low, high) with {lo} <= low <= high, "
                         f"got {value!r}")
    return int(value[0]), int(value[1])


def check_rate(rate: Any) -> float | None:
    """None for an offline workload (rate None or inf), else the positive rate."""
    if rate is None or (isinstance(rate, float) and math.isinf(rate) and rate > 0):
        return None
    return positive_number(rate, "rate, when not None or inf,")


def check_vocab(vocab_size: Any) -> int:
    # Two ids are the least that still lets distinct segments differ.
    n = int_at_least(vocab_size, "vocab_size", 2)
    if n > TOKEN_ID_LIMIT:
        raise ValueError(f"vocab_size must be <= 2**32 (token ids are 32-bit), got {n!r}")
    return n


def _approx(n: int) -> str:
    """An int for a message: exact with separators when small, else like 1.2e+15 (math.log10
    handles ints of any size, where float() and str() may not)."""
    if n < 10**12:
        return f"{n:,}"
    e = math.log10(n)
    mantissa, exp = round(10 ** (e % 1), 1), int(e)
    if mantissa >= 10:
        mantissa, exp = mantissa / 10, exp + 1
    return f"{mantissa:.1f}e+{exp}"


def check_budget(generator: str, params: dict[str, Any], requests: int, total: int,
                 largest: int, at_least: bool = False) -> None:
    """Refuse sizes over the bounds before anything is generated. `params` are the sizes the
    estimate comes from, named in the message; at_least=True marks `total` and `requests`
    as lower bounds (their exact values were not worth computing)."""
    given = ", ".join(f"{k}={_approx(v) if is_int(v) and v >= 10**12 else repr(v)}"
                      for k, v in params.items())
    more = "more than " if at_least else ""
    if total > MAX_WORKLOAD_TOKENS:
        raise ValueError(f"{generator}: {given} would generate {more}{_approx(total)} "
                         f"tokens, over the bound of {MAX_WORKLOAD_TOKENS:,} (2**31) tokens "
                         f"per workload")
    if requests > MAX_WORKLOAD_REQUESTS:
        raise ValueError(f"{generator}: {given} would generate {more}{_approx(requests)} "
                         f"requests, over the bound of {MAX_WORKLOAD_REQUESTS:,} (2**24) "
                         f"requests per workload")
    if largest > MAX_REQUEST_TOKENS:
        raise ValueError(f"{generator}: {given} would make a request of up to "
                         f"{_approx(largest)} tokens, over the bound of "
                         f"{MAX_REQUEST_TOKENS:,} (2**24) tokens per request")


def streams(name: str, seed: Any) -> tuple[np.random.Generator, np.random.Generator]:
    """(content, timing) generators for one generator name and seed."""
    ss = np.random.SeedSequence([int_at_least(seed, "seed", 0), zlib.crc32(name.encode())])
    content, timing = ss.spawn(2)
    return np.random.default_rng(content), np.random.default_rng(timing)


def tokens(rng: np.random.Generator, n: int, vocab_size: int) -> tuple[int, ...]:
    """n token ids uniform in [0, vocab_size); no id is reserved."""
    return tuple(rng.integers(0, vocab_size, n).tolist())


def length(rng: np.random.Generator, r: Range) -> int:
    """A length uniform in the inclusive range r."""
    return int(rng.integers(r[0], r[1] + 1))


def starts(rng: np.random.Generator, n: int, rate: float | None) -> list[float]:
    """n Poisson arrival times at `rate` (NOMINAL_RATE when offline), the first at 0."""
    gaps = rng.exponential(1.0 / (rate or NOMINAL_RATE), n)
    return [0.0] + np.cumsum(gaps[:-1]).tolist() if n else []


def meta(**params: Any) -> dict[str, Any]:
    """Generator parameters in JSON types, so a JSONL round trip keeps them equal."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, tuple):
            v = list(v)
        elif isinstance(v, np.generic):
            v = v.item()    # numpy scalars pass validation but json cannot write them
        elif isinstance(v, float) and math.isinf(v):
            v = None  # rate=inf means the same as None, and JSON has no inf
        out[k] = v
    return out


class Builder:
    """Collects requests with their scheduled times, then builds the Workload."""

    def __init__(self, name: str, rate: float | None, params: dict[str, Any]) -> None:
        self.name, self.rate, self.params = name, rate, params
        self._items: list[tuple[float, dict[str, Any]]] = []

    def add(self, time: float, **kw: Any) -> None:
        self._items.append((time, kw))

    def build(self) -> Workload:
        # Python's sort is stable: equal times keep insertion order.
        items = sorted(self._items, key=lambda it: it[0])
        offline = self.rate is None
        reqs = [TraceRequest(arrival=0.0 if offline else t, **kw) for t, kw in items]
        return Workload(self.name, reqs,
                        meta={"source": f"generator:{self.name}", **meta(**self.params)})


def conversation(content: np.random.Generator, prefix: tuple[int, ...], turns: int,
                 msg_len: Range, reply_len: Range, vocab_size: int
                 ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(prompt, reply) per turn: prompt = prefix + all earlier messages and replies + message."""
    out = []
    history: tuple[int, ...] = ()
    for _ in range(turns):
        msg = tokens(content, length(content, msg_len), vocab_size)
        reply = tokens(content, length(content, reply_len), vocab_size)
        prompt = prefix + history + msg
        out.append((prompt, reply))
        history = history + msg + reply
    return out


def turn_times(timing: np.random.Generator, start: float, reply_lens: list[int],
               think_time: float, tpot: float) -> list[float]:
    """Arrival of each turn: the previous arrival + its nominal generation time
    (reply length x tpot) + an exponential think time. Strictly increasing whenever
    replies are non-empty or think_time > 0."""
    times = [start]
    for n in reply_lens[:-1]:
        think = timing.exponential(think_time) if think_time > 0 else 0.0
        times.append(times[-1] + n * tpot + think)
    return times
