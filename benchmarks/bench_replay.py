"""Replay benchmark: per-request CPU cost of the block-hash cache against the radix tree.

One run replays the support workload (unlimited capacity) and, when the trace is present, the
Mooncake trace at unlimited and at limited capacity, through three caches: radix (page 1,
LRU), blockhash with KV events off, and blockhash with KV events on (every stored block's
chained hash computed and an event recorded). Each blockhash figure stands beside the radix
figure of the same run, with the ratio blockhash / radix; the last column says whether the
events-on replay hit exactly the tokens the events-off replay hit, request by request.

    python benchmarks/bench_replay.py [--users 200] [--turns 5] [--mooncake PATH]
        [--capacity 3000000] [--block-size 16] [--hash sha256|xxhash] [--repeat 1]
        [--skip-mooncake]
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from radixkv.config import CacheConfig
from radixkv.offline.replay import ReplayStats, replay
from radixkv.workloads import load_workload, make_workload

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/synthetic_trace.jsonl"


def _configs(block_size: int, hash_algo: str) -> dict[str, CacheConfig]:
    return {"radix": CacheConfig("radix", 1, "lru"),
            "blockhash": CacheConfig("blockhash", block_size, "lru", hash_algo=hash_algo),
            "blockhash + events": CacheConfig("blockhash", block_size, "lru", hash_algo=hash_algo,
                                              enable_events=True)}


def _measure(w, cfg: CacheConfig, capacity: int | None, repeat: int) -> ReplayStats:
    """The replay with the least CPU per request of `repeat` (a fresh cache each time; the
    hits of every repeat must agree)."""
    runs = [replay(w, cfg.build(), capacity) for _ in range(repeat)]
    assert all(r.hits == runs[0].hits for r in runs), f"{cfg.label}: hits differ between repeats"
    return min(runs, key=lambda r: r.cpu_us_per_request)


def compare(console: Console, title: str, w, capacity: int | None, block_size: int,
            hash_algo: str, repeat: int) -> dict[str, ReplayStats]:
    s = {name: _measure(w, cfg, capacity, repeat) for name, cfg in _configs(block_size, hash_algo).items()}
    cap = "unlimited" if capacity is None else f"{capacity:,} tokens"
    t = Table(title=f"{title}: {len(w):,} requests, {w.num_prompt_tokens:,} prompt tokens, "
                    f"capacity {cap}")
    for col in ("cache", "CPU µs/request", "÷ radix", "hit tokens", "hit rate", "evicted tokens",
                "hits = events off"):
        t.add_column(col, justify="right", no_wrap=True)
    base = s["radix"].cpu_us_per_request
    for name, st in s.items():
        same = "" if name != "blockhash + events" else ("yes" if st.hits == s["blockhash"].hits else "NO")
        t.add_row(f"{st.label}{' + events' if name.endswith('events') else ''}",
                  f"{st.cpu_us_per_request:,.0f}", f"{st.cpu_us_per_request / base:.2f}",
                  f"{st.hit_tokens:,}", f"{st.hit_rate:.4f}", f"{st.evicted_tokens:,}", same)
    console.print(t)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=200)
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--mooncake", type=Path, default=MOONCAKE)
    ap.add_argument("--capacity", type=int, default=3_000_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--hash", default="sha256", dest="hash_algo")
    ap.add_argument("--repeat", type=int, default=1, help="replays per cache; the fastest counts")
    ap.add_argument("--skip-mooncake", action="store_true")
    args = ap.parse_args()
    console = Console(width=max(Console().width, 130))     # one line per row, piped or not
    opts = (args.block_size, args.hash_algo, args.repeat)
    w = make_workload("support", num_users=args.users, turns=args.turns)
    compare(console, f"support {args.users} users x {args.turns} turns", w, None, *opts)
    if args.skip_mooncake:
        return
    if not args.mooncake.is_file():
        console.print(f"Mooncake trace not found at {args.mooncake}: skipped")
        return
    w = load_workload(args.mooncake)
    for cap in (None, args.capacity):
        compare(console, args.mooncake.name, w, cap, *opts)


if __name__ == "__main__":
    main()
