"""Which replica counts a family cannot serve the trace with: the one-pass hit-rate curves and
the GPU's best rates give a lower bound on the work, and a pool whose workers would be busy
past the trace's end by more than the TTFT target is not simulated.

Work, in seconds of one worker, at least:

  prefill(h) = prompt tokens * (1 - h) / best prefill rate   (all but the longest 1 % of prompts)
  decode     = output tokens / best decode rate

h is the most the cache can hit with the pool's memory: the LRU curve (planning/onepass.py) at
the pool's total KV (one cache of every worker's memory, the best any routing can do), the
unlimited cache's rate for the orders without a one-pass curve, 0 without a cache. The best
rates are the step times' most favourable shapes (a full chunk or many short segments of
prefill with nothing cached; a full batch of one-token contexts). A pool of n workers is
pruned when its prefill work over n exceeds the trace's span plus the TTFT target (every
request has arrived by the span's end, and 99 % must have their first token within the
target), when a disaggregated decode pool's work over its workers does, or, with an E2E
target, when all the work (an aggregated worker's decodes and prefills take separate steps
unless mixed) over n exceeds the span plus that target. These are rules on bounds, not proofs:
a prompt's hit rate may exceed the pool's average; `radixkv plan --exhaustive` checks them.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from radixkv.offline.planning.onepass import lru_hit_curve
from radixkv.offline.planning.space import Family, Setting
from radixkv.workloads import TraceRequest


class Work(NamedTuple):
    prefill_s: float           # at the pool's best hit rate
    decode_s: float
    hit_rate: float            # that hit rate


class Bounds:
    def __init__(self, requests: list[TraceRequest], setting: Setting, ttft_s: float | None,
                 e2e_s: float | None = None):
        self.requests, self.setting = requests, setting
        # no TTFT target: nothing is pruned for TTFT
        self.ttft_s = float("inf") if ttft_s is None else ttft_s
        self.e2e_s = e2e_s
        arr = [r.arrival for r in requests]
        self.span = (max(arr) - min(arr)) if arr else 0.0
        # the TTFT target binds 99 % of requests: the prompts of all but the longest 1 %
        lens = sorted(len(r.prompt) for r in requests)
        self.prompt = sum(lens[:len(lens) - len(lens) // 100])
        self.output = sum(r.output_len for r in requests)
        self._curves: dict[tuple[str, int, int], tuple[np.ndarray, np.ndarray, float]] = {}

    def best_hit_rate(self, fam: Family, workers: int) -> float:
        if fam.cache == "none":
            return 0.0
        kind = "radix" if fam.cache == "radix" else "blockhash"
        caps, rates, ceiling = self._curve(kind, fam.page_size, fam)
        if fam.cache == "radix" and fam.eviction != "lru":
            return ceiling
        total = self.setting.kv_tokens(fam) * workers
        i = int(np.searchsorted(caps, total, side="right")) - 1
        return ceiling if i >= len(caps) - 1 else float(rates[max(i + 1, 0)])

    def _curve(self, kind: str, page: int, fam: Family):
        """Capacities doubling from one worker's pool, and the rate at each (the next one up
        is used between points, so the bound errs high)."""
        one = max(self.setting.kv_tokens(fam), page)
        key = (kind, page, one)
        if key not in self._curves:
            caps = [one * (1 << k) for k in range(8)]
            c = lru_hit_curve(self.requests, kind, page, caps + [None])
            rates = np.nan_to_num(c.hit_rate, nan=0.0)
            self._curves[key] = (np.array(caps), rates[:-1], float(rates[-1]))
        return self._curves[key]

    def rates(self, fam: Family) -> tuple[float, float]:
        """(prefill, decode) tokens per second of one worker at their best."""
        cost = self.setting.replica(fam.gpu, fam.tp).cost
        sched = self.setting.engine(fam).sched
        chunk = sched.prefill_budget
        pre = max(chunk / cost.step_time([(0, chunk)], ()),
                  chunk / cost.step_time([(0, 256)] * (chunk // 256), ()) if chunk >= 256
                  else 0.0)
        b = sched.max_running_requests
        dec = b / cost.step_time((), [1] * b)
        return pre, dec

    def work(self, fam: Family, cache_workers: int) -> Work:
        h = self.best_hit_rate(fam, cache_workers)
        pre, dec = self.rates(fam)
        return Work(self.prompt * (1 - h) / pre, self.output / dec, h)

    def feasible(self, fam: Family, workers: int, prefill: int = 0, decode: int = 0) -> bool:
        """False when the pool cannot keep up (the module's rule); True may still fail."""
        if fam.disaggregated:
            return self.prefill_ok(fam, prefill) and self.decode_ok(fam, decode)
        w = self.work(fam, workers)
        if w.prefill_s / workers > self.span + self.ttft_s:
            return False
        mixed = self.setting.engine(fam).sched.mixed_decode
        busy = max(w.prefill_s, w.decode_s) if mixed else w.prefill_s + w.decode_s
        return self.e2e_s is None or busy / workers <= self.span + self.e2e_s

    def prefill_ok(self, fam: Family, prefill: int) -> bool:
        """A disaggregated prefill pool of that many workers is not pruned."""
        return self.work(fam, prefill).prefill_s / prefill <= self.span + self.ttft_s

    def decode_ok(self, fam: Family, decode: int) -> bool:
        """A disaggregated decode pool of that many workers is not pruned."""
        busy = self.work(fam, 1).decode_s / decode
        return busy <= self.span + self.ttft_s and (
            self.e2e_s is None or busy <= self.span + self.e2e_s)

    def least_workers(self, fam: Family, most: int) -> int:
        """The fewest aggregated workers, or prefill workers (leaving room for the fewest
        decode workers), that are not pruned; most + 1 when none is."""
        d = self.least_decode(fam, most) if fam.disaggregated else 0
        for n in range(1, most - d + 1):
            if self.prefill_ok(fam, n) if fam.disaggregated else self.feasible(fam, n):
                return n
        return most + 1

    def least_decode(self, fam: Family, most: int) -> int:
        """The fewest decode workers not pruned; most + 1 when none is."""
        return next((d for d in range(1, most + 1) if self.decode_ok(fam, d)), most + 1)
