"""A router's figures on a cluster run: the row `radixkv cluster` prints and writes."""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from radixkv.engine.metrics import EngineReport

ROW_KEYS = ("router", "hit_rate", "prefill_tokens", "ttft_p50", "ttft_p99", "e2e_p99",
            "throughput_tok_s", "imbalance", "evicted_tokens")


class ClusterResult(NamedTuple):
    router: str
    hit_rate: float
    prefill_tokens: int
    ttft_p50: float | None
    ttft_p99: float | None
    e2e_p99: float | None
    throughput_tok_s: float | None
    imbalance: float                 # max over mean of the tokens each replica computed
    evicted_tokens: int
    replica_tokens: tuple[int, ...]  # tokens each replica computed (prefill + output)
    details: dict                    # the whole cluster's engine summary

    def row(self) -> dict:
        """The JSON row: the key figures, the per-replica tokens, then the whole summary."""
        return {k: getattr(self, k) for k in ROW_KEYS} | {
            "replica_tokens": list(self.replica_tokens), "details": self.details}


def imbalance(tokens: Sequence[int]) -> float:
    """max / mean; 1.0 for an even split (and for no work at all)."""
    mean = sum(tokens) / len(tokens)
    return max(tokens) / mean if mean > 0 else 1.0


def cluster_result(router: str, merged: EngineReport,
                   replicas: Sequence[EngineReport]) -> ClusterResult:
    s = merged.summary()
    tokens = tuple(r.prefill_tokens + r.output_tokens for r in replicas)
    return ClusterResult(router, s["hit_rate"], s["prefill_tokens"], s["ttft_p50"],
                         s["ttft_p99"], s["e2e_p99"], s["throughput_tok_s"], imbalance(tokens),
                         s["evicted_tokens"], tokens, s)
