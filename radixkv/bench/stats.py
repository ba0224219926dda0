"""What a served benchmark measures: one record per request sent, and the run's summary
(counts, throughput, latency percentiles, prompt and cached tokens)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# how many distinct error messages a summary keeps, with their counts
ERROR_EXAMPLES = 5


@dataclass
class RequestRecord:
    """One request: when it was sent (seconds after the run's start), its latencies in
    seconds (TTFT to the first content chunk, the gaps between content chunks, E2E to the end
    of the stream), its token counts as the server reported them, and its error, if any."""
    id: str
    sent: float
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _stats(prefix: str, values: Sequence[float]) -> dict[str, float | None]:
    """prefix_mean, _p50, _p90, _p99 (numpy's linear percentiles); None without values."""
    keys = [f"{prefix}_mean", f"{prefix}_p50", f"{prefix}_p90", f"{prefix}_p99"]
    if not len(values):
        return dict.fromkeys(keys)
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99]).tolist()
    return dict(zip(keys, [float(a.mean()), p50, p90, p99]))


def summarize(records: Sequence[RequestRecord], duration: float,
              requests: int | None = None) -> dict:
    """The run's figures. Latencies and token counts are over completed requests; throughput
    divides by `duration` (the run's wall time, seconds); `requests` is how many the workload
    held (default: the records), those never sent counting as not_sent."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    total = len(records) if requests is None else requests
    prompt = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: None)
    examples = Counter(r.error for r in failed).most_common(ERROR_EXAMPLES)
    return {
        "requests": total,
        "completed": len(done),
        "errors": len(failed),
        "not_sent": total - len(records),
        "duration_s": duration,
        "request_throughput_req_s": per_s(len(done)),
        "input_tok_s": per_s(prompt),
        "output_tok_s": per_s(output),
        **_stats("ttft", [r.ttft for r in done if r.ttft is not None]),
        **_stats("itl", [x for r in done for x in r.itls]),
        **_stats("e2e", [r.e2e for r in done if r.e2e is not None]),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": output,
        "cached_token_rate": cached / prompt if prompt else None,
        "error_examples": dict(examples),
    }
