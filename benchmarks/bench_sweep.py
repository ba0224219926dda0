"""One-pass LRU hit curve against one replay.

On the Mooncake synthetic trace (skipped when absent) and on the `support` generator: the wall
time of one `replay` (radix, page 1, LRU, unlimited) and of `lru_hit_curve` at 64 log-spaced
capacities from the largest request to the footprint, then sweep / replay. A ratio near 1
means the whole curve costs about what one point of it cost by replaying.

    .venv/bin/python benchmarks/bench_sweep.py [--points 64] [--kind radix] [--page-size 1]
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from radixkv.config import CacheConfig
from radixkv.offline.planning.onepass import lru_hit_curve
from radixkv.offline.replay import replay
from radixkv.workloads import load_workload, make_workload

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/synthetic_trace.jsonl"


def bench(name: str, w, kind: str, ps: int, points: int) -> None:
    t0 = time.perf_counter()
    stats = replay(w, CacheConfig(kind, ps, "lru").build())
    t_replay = time.perf_counter() - t0
    need = max(-(-(len(r.prompt) + r.output_len) // ps) * ps for r in w)
    t0 = time.perf_counter()
    probe = lru_hit_curve(w, kind, ps, [None])
    caps = np.unique(np.geomspace(need, max(probe.peak_tokens, need), points).astype(np.int64))
    t1 = time.perf_counter()
    curve = lru_hit_curve(w, kind, ps, caps.tolist())
    t_sweep, t_curve = time.perf_counter() - t0, time.perf_counter() - t1
    top = int(np.flatnonzero(curve.feasible)[-1])
    assert curve.hit_tokens[top] == stats.hit_tokens      # the peak holds everything: no eviction
    print(f"{name}: {len(w):,} requests, {w.num_prompt_tokens:,} prompt tokens, {kind} p{ps}")
    print(f"  replay (unlimited)         {t_replay:8.2f} s   hit rate {stats.hit_rate:.4f}")
    print(f"  one-pass curve ({len(caps)} caps)  {t_sweep:8.2f} s   "
          f"(includes a first pass for the peak of {probe.peak_tokens:,} tokens)")
    print(f"  the curve alone            {t_curve:8.2f} s")
    print(f"  sweep / replay             {t_sweep / t_replay:8.2f}   (curve alone: {t_curve / t_replay:.2f})")
    for j in np.linspace(0, len(caps) - 1, 6).astype(int):
        rate = curve.hit_rate[j]
        print(f"    {int(curve.capacities[j]):>12,} tokens  hit rate {rate:.4f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=64)
    ap.add_argument("--kind", default="radix", choices=("radix", "blockhash"))
    ap.add_argument("--page-size", type=int, default=1)
    args = ap.parse_args()
    ps = 16 if args.kind == "blockhash" and args.page_size == 1 else args.page_size
    if MOONCAKE.exists():
        bench("mooncake", load_workload(str(MOONCAKE)), args.kind, ps, args.points)
    else:
        print(f"mooncake: skipped ({MOONCAKE} not found)")
    bench("support", make_workload("support"), args.kind, ps, args.points)


if __name__ == "__main__":
    main()
