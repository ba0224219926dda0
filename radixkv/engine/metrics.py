"""Per-request records and the run's totals: hit rate, prefill work, latency percentiles,
throughput, eviction, retraction, and KV usage / queue length over time."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
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

    @classmethod
    def of(cls, r) -> "RequestRecord":
        out = len(r.output)
        return cls(r.rid, r.arrival, r.first_admit - r.arrival, r.first_token - r.arrival,
                   (r.finish_time - r.first_token) / max(out - 1, 1), r.finish_time - r.arrival,
                   r.prompt_len, out, r.cached_tokens, r.prefill_tokens, r.recomputed_tokens,
                   r.retractions)


def _pct(xs: Sequence[float], q: float) -> float:
    return float(np.percentile(xs, q)) if len(xs) else float("nan")


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

    def summary(self) -> dict:
        ttft = [r.ttft for r in self.records]
        e2e = [r.e2e for r in self.records]
        span = max(self.makespan, 1e-9)
        used = self.timeline.get("kv_used", [])
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
            "tpot_mean": float(np.mean([r.tpot for r in self.records])) if self.records else float("nan"),
            "throughput_tok_s": self.output_tokens / span,
            "total_tok_s": (self.prompt_tokens + self.output_tokens) / span,
            "evicted_tokens": self.evicted_tokens,
            "retractions": self.retractions,
            "held_back": self.held_back,
            "lpm_fallbacks": self.lpm_fallbacks,
            "peak_kv_usage": (max(used) / self.kv_capacity) if used else 0.0,
            "peak_queue": max(self.timeline.get("waiting", [0]) or [0]),
            "makespan_s": self.makespan,
            "steps": self.steps,
        }
