"""Cluster-simulation speed: wall seconds and simulated requests per second through N replicas
behind each router, beside NVIDIA Dynamo's simulator (DynoSim, `aisimulate`) on the same trace
and replicas, measured in the same run when it is installed (`.peers/dynosim`, see
benchmarks/peers.py); and how the cost grows with replicas and trace length.

The radixkv figure of a router is its `run_cluster` wall (the trace loaded once, before, as
`radixkv cluster` loads it once for all its routers; the load is printed on its own line);
DynoSim's is its whole `aisimulate predict` process (its startup and trace loading included).
Goal (issue 23): Mooncake synthetic at 8 replicas within 2× DynoSim for every router.

    python benchmarks/bench_cluster.py [--trace PATH] [--replicas 1 8 32] [--fractions 0.25 0.5 1]
        [--router round-robin radixkv ...]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from radixkv.config import CacheConfig, EngineConfig  # noqa: E402
from radixkv.offline.replay import collect_simulation  # noqa: E402
from radixkv.offline.cluster.simulator import ClusterConfig, run_cluster  # noqa: E402
from radixkv.sim.costmodel import CostModel  # noqa: E402
from radixkv.workloads import load_workload, make_workload  # noqa: E402

TRACE = ROOT.parent / "shared/traces/mooncake/synthetic_trace.jsonl"
AISIM = ROOT.parent / "shared/peers/aisim"
DYNOSIM = ROOT / ".peers/dynosim/bin/aisimulate"
REPLICA_TOKENS = 432_992         # DynoSim's KV tokens per H100 replica for Llama-3.1-8B (vLLM)
# DynoSim's runs of the same trace: its router name, and radixkv's router it is set beside
DYNOSIM_RUNS = {"round-robin": "mooncake_synthetic_h100x8_rr.yaml",
                "kv (Dynamo's KV router)": "mooncake_synthetic_h100x8_kv.yaml"}
ALL_ROUTERS = ["round-robin", "power-of-two", "least-load", "session-hash", "ray-prefix-affinity",
               "sglang-cache-aware", "llm-d-precise", "radixkv", "radixkv-fit"]


def timed(fn) -> tuple[float, object]:
    collect_simulation()        # the last run's cycles, freed outside the timer (as compare.py does)
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def dynosim(con: Console) -> dict[str, tuple[float, float, float | None]]:
    """DynoSim's process wall seconds, reuse ratio and the wall time it reports itself (its
    simulation, without its start-up) per run; empty, saying why, when it cannot run."""
    if not DYNOSIM.is_file():
        con.print(f"DynoSim: skipped, {DYNOSIM.relative_to(ROOT)} is absent "
                  f"(python benchmarks/peers.py dynosim)")
        return {}
    if not AISIM.is_dir():
        con.print(f"DynoSim: skipped, {AISIM} is absent")
        return {}
    out = {}
    for name, cfg in DYNOSIM_RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            s, proc = timed(lambda: subprocess.run(
                [str(DYNOSIM), "predict", "--stack", "dynamo", "-c", str(AISIM / cfg),
                 "--output-dir", tmp, "--overwrite"], cwd=ROOT, capture_output=True, text=True))
            if proc.returncode:
                con.print(f"DynoSim {name}: failed ({proc.returncode}): {proc.stderr[-300:]}")
                continue
            summary = json.loads((Path(tmp) / "prediction.json").read_text())["summary"]
            own = re.search(r"Wall Time \(ms\): ([\d,.]+)", proc.stdout)   # its own timer
            out[name] = (s, summary["prefix_cache_reused_ratio"],
                         float(own.group(1).replace(",", "")) / 1e3 if own else None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--replicas", type=int, nargs="+", default=[8],
                    help="replica counts to time: the first with every --router, beside "
                         "DynoSim; the others with round-robin and radixkv")
    ap.add_argument("--fractions", type=float, nargs="+", default=[],
                    help="also time round-robin and radixkv on these leading shares of the trace")
    ap.add_argument("--router", nargs="+", default=ALL_ROUTERS)
    ap.add_argument("--no-dynosim", action="store_true")
    args = ap.parse_args()
    con = Console(width=160)
    if args.trace.is_file():
        load_s, wl = timed(lambda: load_workload(str(args.trace)))
    else:
        con.print(f"{args.trace} is absent: the support workload instead (no DynoSim)")
        load_s, wl = timed(lambda: make_workload("support"))
        args.no_dynosim = True
    cost = CostModel.named("llama-3-8b", "h100-sxm")
    cache = CacheConfig("radix", 16)
    n = len(wl)
    peer = {} if args.no_dynosim else dynosim(con)
    con.print(f"{wl.name}: {n:,} requests loaded in {load_s:.1f} s")
    for k, replicas in enumerate(args.replicas):
        cfg = ClusterConfig(EngineConfig(kv_capacity=REPLICA_TOKENS, cache=cache), replicas)
        tab = Table(title=f"{wl.name}: {replicas} replicas × {REPLICA_TOKENS:,} KV tokens "
                          f"(radix p16, Llama-3-8B on H100)")
        for col in ("router", "wall s", "simulated requests / s", "hit rate"):
            tab.add_column(col, justify="left" if col == "router" else "right")
        if k == 0:
            for name, (s, reuse, own) in peer.items():
                tab.add_row(f"DynoSim {name}", f"{s:.2f}", f"{n / s:,.0f}", f"{reuse:.3f}")
                if own is not None:
                    tab.add_row("  its own 'Wall Time'", f"{own:.2f}", f"{n / own:,.0f}", "")
        for name in args.router if k == 0 else ["round-robin", "radixkv"]:
            s, res = timed(lambda: run_cluster(wl, cfg, name, cost))
            tab.add_row(f"radixkv {name}", f"{s:.2f}", f"{n / s:,.0f}", f"{res.hit_rate:.3f}")
        con.print(tab)
    if args.fractions:
        tab = Table(title=f"{wl.name}: cost against trace length, {args.replicas[0]} replicas")
        for col in ("requests", "router", "wall s", "µs per request"):
            tab.add_column(col, justify="right")
        cfg = ClusterConfig(EngineConfig(kv_capacity=REPLICA_TOKENS, cache=cache),
                            args.replicas[0])
        for f in args.fractions:
            part = wl[:max(1, round(f * n))] if f < 1 else wl
            for name in ("round-robin", "radixkv"):
                s, _ = timed(lambda: run_cluster(part, cfg, name, cost))
                tab.add_row(f"{len(part):,}", name, f"{s:.2f}", f"{1e6 * s / len(part):,.0f}")
        con.print(tab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
