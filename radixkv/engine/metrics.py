"""Per-request records and the run's totals: hit rate, prefill work, latency percentiles,
throughput, eviction, retraction, and KV usage / queue length over time."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np


class RequestRecord(NamedTuple):
    rid: str
    arrival: float
    queue_time: float        # first admission - arrival
    ttft: float              # first token - arrival
    tpot: float              # (finish - first token) / (output tokens - 1)
    e2e: float               # finish - arrival
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int       # hit at first admission (counted once)
    prefill_tokens: int      # computed by prefill, all admissions
    recomputed_tokens: int   # prefill after retractions (not a hit)
    retractions: int
    # absolute time of the first admission; optional so that records built from the twelve
    # fields above still construct (`admitted` then falls back to arrival + queue_time)
    first_admit: float | None = None

    @property
    def admitted(self) -> float:
        return self.arrival + self.queue_time if self.first_admit is None else self.first_admit

    @classmethod
    def of(cls, r) -> "RequestRecord":
        out = len(r.output)
        return cls(r.rid, r.arrival, r.first_admit - r.arrival, r.first_token - r.arrival,
                   (r.finish_time - r.first_token) / max(out - 1, 1), r.finish_time - r.arrival,
                   r.prompt_len, out, r.cached_tokens, r.prefill_tokens, r.recomputed_tokens,
                   r.retractions, r.first_admit)


def _finite(x: float | None) -> float | None:
    # summary() goes to strict JSON: a value that is not a finite number is reported as missing
    return float(x) if x is not None and math.isfinite(x) else None


def _pct(xs: Sequence[float], q: float) -> float | None:
    if not len(xs):
        return None
    with np.errstate(invalid="ignore"):     # an infinite sample interpolates to NaN: None below
        return _finite(np.percentile(xs, q))


@dataclass(frozen=True)
class EngineReport:
    name: str
    records: list[RequestRecord]
    evicted_tokens: int
    retractions: int
    held_back: int
    lpm_fallbacks: int
    steps: int
    makespan: float                       # first arrival -> last finish, seconds
    kv_capacity: int
    timeline: dict = field(repr=False)    # t, waiting, running, kv_used (one entry per step)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.records)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.records)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / max(self.prompt_tokens, 1)

    @property
    def prefill_tokens(self) -> int:
        return sum(r.prefill_tokens for r in self.records)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.records)

    def timeline_series(self, window: float) -> dict[str, np.ndarray]:
        """Per engine step (arrays of equal length): "t" the simulated time after the step,
        "waiting" and "running" request counts, "kv_used" slots, "kv_usage" the share of
        kv_capacity, and "hit_rate" = cached / prompt tokens of the finished requests first
        admitted in (t - window, t]; NaN where no request was admitted in that window."""
        if not window > 0:
            raise ValueError(f"window must be positive, got {window!r}")
        tl = self.timeline
        t = np.asarray(tl.get("t", []), dtype=float)
        kv_used = np.asarray(tl.get("kv_used", []), dtype=float)
        recs = sorted(self.records, key=lambda r: r.admitted)
        admitted = np.array([r.admitted for r in recs], dtype=float)
        cached = np.concatenate([[0], np.cumsum([r.cached_tokens for r in recs], dtype=np.int64)])
        prompt = np.concatenate([[0], np.cumsum([r.prompt_tokens for r in recs], dtype=np.int64)])
        hi = np.searchsorted(admitted, t, side="right")
        lo = np.searchsorted(admitted, t - window, side="right")
        hits, tokens = cached[hi] - cached[lo], prompt[hi] - prompt[lo]
        hit_rate = np.where(tokens > 0, hits / np.maximum(tokens, 1), np.nan)
        return {
            "t": t,
            "hit_rate": hit_rate.astype(float),
            "waiting": np.asarray(tl.get("waiting", []), dtype=float),
            "running": np.asarray(tl.get("running", []), dtype=float),
            "kv_used": kv_used,
            "kv_usage": kv_used / max(self.kv_capacity, 1),
        }

    def summary(self) -> dict:
        """The run's figures; strict-JSON safe: a percentile or mean over no finished requests
        is None, and so is a throughput over a zero makespan with tokens in it."""
        ttft = [r.ttft for r in self.records]
        e2e = [r.e2e for r in self.records]
        used = self.timeline.get("kv_used", [])

        def tokens_per_s(n: int) -> float | None:
            if not n:
                return 0.0
            return _finite(n / self.makespan) if self.makespan > 0 else None

        return {
            "name": self.name,
            "requests": len(self.records),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.hit_rate,
            "prefill_tokens": self.prefill_tokens,
            "recomputed_tokens": sum(r.recomputed_tokens for r in self.records),
            "output_tokens": self.output_tokens,
            "ttft_p50": _pct(ttft, 50), "ttft_p90": _pct(ttft, 90), "ttft_p99": _pct(ttft, 99),
            "e2e_p50": _pct(e2e, 50), "e2e_p90": _pct(e2e, 90), "e2e_p99": _pct(e2e, 99),
            "tpot_mean": _finite(np.mean([r.tpot for r in self.records])) if self.records else None,
            "throughput_tok_s": tokens_per_s(self.output_tokens),
            "total_tok_s": tokens_per_s(self.prompt_tokens + self.output_tokens),
            "evicted_tokens": self.evicted_tokens,
            "retractions": self.retractions,
            "held_back": self.held_back,
            "lpm_fallbacks": self.lpm_fallbacks,
            "peak_kv_usage": (max(used) / max(self.kv_capacity, 1)) if used else 0.0,
            "peak_queue": max(self.timeline.get("waiting", [0]) or [0]),
            "makespan_s": _finite(self.makespan),
            "steps": self.steps,
        }


def itl_percentiles(timelines: Sequence[dict], qs: Sequence[float] = (50, 99)
                    ) -> list[float | None]:
    """Inter-token latency percentiles over every token of engines' runs, from their timelines:
    a step's duration (the time since the engine's previous step ended) is the wait of every
    request running before it for its next token, so it counts once for each of them; the
    first step of a request (its first token, a TTFT) does not count, nor does idle time (no
    request was running before it). None for each when no token waited."""
    gaps, weights = [], []
    for tl in timelines:
        t = np.asarray(tl.get("t", ()), dtype=float)
        running = np.asarray(tl.get("running", ()), dtype=float)
        if len(t) > 1:
            gaps.append(np.diff(t))
            weights.append(running[:-1])
    if not gaps:
        return [None] * len(qs)
    gap, w = np.concatenate(gaps), np.concatenate(weights)
    keep = w > 0
    gap, w = gap[keep], w[keep]
    if not len(gap):
        return [None] * len(qs)
    order = np.argsort(gap, kind="stable")
    gap, cum = gap[order], np.cumsum(w[order])
    return [_finite(gap[min(np.searchsorted(cum, q / 100 * cum[-1]), len(gap) - 1)])
            for q in qs]
