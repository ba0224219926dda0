"""Engine-simulation benchmarks.

1. Simulation speed: the Mooncake FAST'25 synthetic trace (3,993 requests) through the engine
   on a simulated Llama-3-8B / H100, in simulated requests per wall second; target: the whole
   trace in under 30 s. Baseline in the same run: the sequential replay of the same requests
   through the same cache (no scheduler, no cost model).
2. LPM round cost: one scheduling round (policy order, dedup check, admission attempt, decode
   plan for the running batch) with 1,000 waiting against 100 waiting; target ratio < 5.

    python benchmarks/bench_sim.py [--trace PATH] [--skip-trace]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from radixkv.cache.base import CacheReq
from radixkv.cache.manager import CacheManager
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.config import EngineConfig, SchedulerConfig
from radixkv.sim.costmodel import CostModel
from radixkv.offline.replay import replay
from radixkv.sched.request import Request
from radixkv.sched.scheduler import Scheduler
from radixkv.offline.simulate import run_config
from radixkv.workloads import make_workload, read_mooncake

TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/synthetic_trace.jsonl"


def bench_trace(path: Path, con: Console) -> bool:
    t0 = time.perf_counter()
    wl = read_mooncake(path)
    load = time.perf_counter() - t0
    cost = CostModel.named("llama-3-8b", "h100-sxm")
    cfg = EngineConfig(kv_capacity=426_784 - 426_784 % 16)   # what fits on one H100 (specs.py)
    t0 = time.perf_counter()
    rep = run_config(wl, cfg, cost)
    sim = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats = replay(wl.requests, RadixCache(), capacity=cfg.kv_capacity)
    base = time.perf_counter() - t0
    s = rep.summary()
    t = Table(title=f"Mooncake synthetic trace: {len(wl):,} requests, {wl.num_prompt_tokens:,} prompt tokens")
    for c in ("run", "wall s", "requests / s", "vs replay"):
        t.add_column(c, justify="right")
    t.add_row("load trace", f"{load:.1f}", "", "")
    t.add_row("engine + scheduler + cost model", f"{sim:.1f}", f"{len(wl) / sim:,.0f}", f"{sim / base:.2f}×")
    t.add_row("baseline: sequential replay", f"{base:.1f}", f"{len(wl) / base:,.0f}", "1.00×")
    con.print(t)
    con.print(f"simulated: {s['steps']:,} steps, hit rate {s['hit_rate']:.3f}, TTFT p50 "
              f"{s['ttft_p50']:.1f} s (one H100 is overloaded by this trace), replay hit rate "
              f"{stats.hit_rate:.3f}")
    ok = load + sim < 30
    con.print(f"whole trace (load + simulate) {load + sim:.1f} s: target < 30 s {'✓' if ok else '✗'}")
    return ok


def _round_cost(n_waiting: int, rounds: int = 60) -> float:
    """Median µs of Scheduler.schedule() with n waiting behind a full running batch of 64:
    the round orders the whole queue by cached prefix and plans the batch's decode."""
    wl = make_workload("support", num_users=max(n_waiting // 4, 50), turns=5, seed=1)
    reqs = [Request(tr.id, tr.prompt, 1, forced_output=tr.output, index=i)
            for i, tr in enumerate(wl)]
    mgr = CacheManager(RadixCache(clock=iter(range(1 << 60)).__next__), SlotPool(4_000_000))

    def put(key):                                       # as a finished request leaves it
        done = CacheReq(key)
        mgr.admit(done, key, len(key))
        mgr.cache_req(done, finished=True)

    warm, rest = reqs[: len(reqs) // 2], reqs[len(reqs) // 2:]
    for r in warm:                                      # a warm tree: half the traffic cached
        put(r.prompt_key)
    sched = Scheduler(SchedulerConfig(policy="lpm", max_running_requests=64), mgr)
    for r in rest[:n_waiting]:
        sched.add(r)
    for r in warm[:64]:                                 # the running batch (spare slots: no alloc)
        mgr.admit(r, r.match_key(), len(r.tokens) + 64)
        r.num_computed = len(r.tokens) - 1
        sched.running.append(r)
    sched.schedule(0.0)
    rng, times = np.random.default_rng(0), []
    for i in range(rounds):
        # between rounds the tree changes a little, as finishing requests insert their KV
        put(warm[int(rng.integers(len(warm)))].prompt_key + rng.integers(0, 999, 64).tolist())
        t0 = time.perf_counter_ns()
        sched.schedule(float(i))
        times.append(time.perf_counter_ns() - t0)
    return float(np.median(times)) / 1e3


def bench_lpm(con: Console) -> bool:
    a, b = _round_cost(100), _round_cost(1000)
    t = Table(title="LPM scheduling round (warm tree, a full running batch of 64)")
    for c in ("waiting", "µs per round", "ratio"):
        t.add_column(c, justify="right")
    t.add_row("100", f"{a:.0f}", "1.00×")
    t.add_row("1,000", f"{b:.0f}", f"{b / a:.2f}×")
    con.print(t)
    ok = b / a < 5
    con.print(f"1,000 / 100 waiting: {b / a:.2f} (target < 5 {'✓' if ok else '✗'}); no FCFS fallback")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--skip-trace", action="store_true")
    args = ap.parse_args()
    con = Console(width=None if sys.stdout.isatty() else 120)
    ok = bench_lpm(con)
    if not args.skip_trace:
        if args.trace.is_file():
            ok &= bench_trace(args.trace, con)
        else:
            con.print(f"trace {args.trace} not found: simulation-speed benchmark skipped")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
