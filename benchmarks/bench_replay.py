"""Replay benchmark: wall time of radix vs blockhash (and none) on the support workload, and
hit rates on the Mooncake trace at unlimited and limited capacity.

The baseline is the block-hash cache replayed in the same run: every figure is printed beside
it, with the ratio radix / blockhash.

    python benchmarks/bench_replay.py [--users 200] [--turns 5] [--mooncake PATH]
        [--capacity 3000000] [--hash sha256|xxhash] [--skip-mooncake]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from radixkv.replay import ReplayStats, build_cache, replay
from radixkv.workloads import load_workload, make_workload

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/synthetic_trace.jsonl"


def _run(w, names: list[str], capacity: int | None, hash_algo: str) -> dict[str, ReplayStats]:
    return {n: replay(w, build_cache(n, hash_algo=hash_algo), capacity) for n in names}


def support(console: Console, users: int, turns: int, hash_algo: str) -> None:
    w = make_workload("support", num_users=users, turns=turns)
    s = _run(w, ["radix", "blockhash", "none"], None, hash_algo)
    t = Table(title=f"support: {len(w):,} requests, {w.num_prompt_tokens:,} prompt tokens, "
                    f"unlimited capacity")
    for col in ("cache", "wall s", "CPU µs/request", "hit rate", "wall / blockhash"):
        t.add_column(col, justify="right")
    base = s["blockhash"].wall_s
    for st in s.values():
        t.add_row(st.label, f"{st.wall_s:.3f}", f"{st.cpu_us_per_request:,.0f}",
                  f"{st.hit_rate:.4f}", f"{st.wall_s / base:.3f}")
    console.print(t)
    console.print(f"radix / blockhash wall time: {s['radix'].wall_s / base:.3f} "
                  f"({base / s['radix'].wall_s:.1f}x faster)")


def mooncake(console: Console, path: Path, capacity: int, hash_algo: str) -> None:
    w = load_workload(path)
    t = Table(title=f"{path.name}: {len(w):,} requests, {w.num_prompt_tokens:,} prompt tokens")
    for col in ("capacity", "cache", "hit rate", "evicted tokens", "wall s", "vs blockhash"):
        t.add_column(col, justify="right")
    for cap in (None, capacity):
        s = _run(w, ["radix", "blockhash"], cap, hash_algo)
        for st in s.values():
            t.add_row("unlimited" if cap is None else f"{cap:,}", st.label, f"{st.hit_rate:.4f}",
                      f"{st.evicted_tokens:,}", f"{st.wall_s:.1f}",
                      f"{st.hit_rate / s['blockhash'].hit_rate:.4f}")
    console.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--mooncake", type=Path, default=MOONCAKE)
    ap.add_argument("--capacity", type=int, default=3_000_000)
    ap.add_argument("--hash", default="sha256", dest="hash_algo")
    ap.add_argument("--skip-mooncake", action="store_true")
    args = ap.parse_args()
    console = Console()
    support(console, args.users, args.turns, args.hash_algo)
    if args.skip_mooncake:
        return
    if args.mooncake.is_file():
        mooncake(console, args.mooncake, args.capacity, args.hash_algo)
    else:
        console.print(f"Mooncake trace not found at {args.mooncake}: skipped")


if __name__ == "__main__":
    main()
