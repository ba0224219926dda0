"""Cluster-simulation speed: simulated requests per wall second through N replicas behind a
router, as a ratio against one engine (`run_config`) on the same trace in the same run (the
same engine and page size; one replica holds the KV of N, so both keep the same KV in all).

Target (issue 11): the Mooncake synthetic trace at 8 replicas through the six compared routers
in under 3 minutes; a router's run costs a few single-engine runs (more, smaller steps, and the
KV events that event-fed routers read), which the ratio shows.

    python benchmarks/bench_cluster.py [--trace PATH] [--replicas 8] [--router radixkv ...]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixkv.config import CacheConfig, EngineConfig  # noqa: E402
from radixkv.router.cluster import ClusterConfig, run_cluster  # noqa: E402
from radixkv.sim.costmodel import CostModel  # noqa: E402
from radixkv.offline.simulate import run_config  # noqa: E402
from radixkv.workloads import load_workload, make_workload  # noqa: E402

TRACE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/synthetic_trace.jsonl"
REPLICA_TOKENS = 400_000


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--limit", type=int, help="first N requests only")
    ap.add_argument("--router", nargs="+", default=["round-robin", "radixkv"])
    args = ap.parse_args()
    con = Console()
    if args.trace.is_file():
        wl = load_workload(str(args.trace), limit=args.limit)
    else:
        con.print(f"{args.trace} is absent: the support workload instead")
        wl = make_workload("support")
    cost = CostModel.named("llama-3-8b", "h100-sxm")
    cache = CacheConfig("radix", 16)
    n = len(wl)
    single_s, _ = timed(lambda: run_config(
        wl, EngineConfig(kv_capacity=REPLICA_TOKENS * args.replicas, cache=cache), cost))
    cfg = ClusterConfig(EngineConfig(kv_capacity=REPLICA_TOKENS, cache=cache), args.replicas)
    tab = Table(title=f"{wl.name}: {n:,} requests · {args.replicas} replicas × "
                      f"{REPLICA_TOKENS:,} KV tokens · simulated requests per wall second")
    for col in ("run", "wall s", "requests / s", "÷ one engine"):
        tab.add_column(col, justify="left" if col == "run" else "right")
    tab.add_row("one engine (run_config)", f"{single_s:.1f}", f"{n / single_s:,.0f}", "1.00")
    total = 0.0
    for name in args.router:
        s, _ = timed(lambda: run_cluster(wl, cfg, name, cost))
        total += s
        tab.add_row(f"cluster, {name}", f"{s:.1f}", f"{n / s:,.0f}", f"{single_s / s:.2f}")
    con.print(tab)
    con.print(f"routers together: {total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
