"""`radixkv replay`: replay a trace or a generated workload through one or more caches, side
by side on the same requests, and print one table (optionally a JSON file)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from radixkv.cache.events import HASH_ALGOS
from radixkv.cache.factory import CACHES
from radixkv.cache.policies import EVICTION_POLICIES
from radixkv.config import CacheConfig
from radixkv.replay import ReplayStats, parse_capacity, pool_size, replay
from radixkv.validate import positive_int
from radixkv.workloads import GENERATORS, Workload, load_workload

PROGRESS_MIN_REQUESTS = 500


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay", help="replay a trace or generated workload through caches side by side",
        description="Replay requests one at a time in arrival order through each cache (same "
                    "workload, loaded once) and compare hit rate, eviction and CPU cost.")
    p.add_argument("workload", metavar="TRACE_OR_GENERATOR",
                   help=f"a trace file (radixkv JSONL or a Mooncake-style hash_ids trace) or a "
                        f"generator name: {', '.join(GENERATORS)}")
    p.add_argument("--cache", nargs="+", default=["radix", "blockhash", "none"], metavar="NAME",
                   help=f"caches to compare (default: all): {', '.join(CACHES.names())}")
    p.add_argument("--capacity", metavar="TOKENS|SIZE",
                   help="KV pool size: tokens (3000000, 3_000_000) or bytes (40GiB, with "
                        "--kv-bytes-per-token); default unlimited")
    p.add_argument("--kv-bytes-per-token", type=int, metavar="N",
                   help="KV bytes one token takes, to turn a byte --capacity into tokens")
    p.add_argument("--page-size", type=int, default=1, metavar="N",
                   help="radix (and none) page size in tokens (default 1)")
    p.add_argument("--block-size", type=int, default=16, metavar="N",
                   help="blockhash block size in tokens (default 16)")
    p.add_argument("--eviction", default="lru", metavar="NAME",
                   help=f"radix eviction policy: {', '.join(EVICTION_POLICIES.names())} (default lru)")
    p.add_argument("--hash", default="sha256", dest="hash_algo", metavar="ALGO",
                   help=f"blockhash block hash: {', '.join(HASH_ALGOS)} (default sha256)")
    p.add_argument("--json", type=Path, metavar="OUT", help="also write the results as JSON")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed trace lines")
    p.add_argument("--limit", type=int, metavar="N", help="replay only the first N requests")
    p.add_argument("--seed", type=int, metavar="N", help="generator seed")
    p.add_argument("--vocab-size", type=int, metavar="N",
                   help="generator vocabulary, or the token range a hash-id trace expands into")
    p.set_defaults(func=run)


def _is_hash_id_trace(path: Path) -> bool:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    first = json.loads(line)
                except ValueError:
                    return False
                return isinstance(first, dict) and ("hash_ids" in first or "input_length" in first)
    return False


def load(args: argparse.Namespace) -> Workload:
    """The workload named by args.workload, with the generator or reader options that apply."""
    spec, kw = args.workload, {}
    if args.limit is not None:
        positive_int(args.limit, "--limit")
    if spec in GENERATORS:
        kw = {k: v for k, v in (("seed", args.seed), ("vocab_size", args.vocab_size)) if v is not None}
    else:
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"{spec!r} is neither a generator ({', '.join(GENERATORS)}) "
                                    f"nor an existing trace file")
        if args.seed is not None:
            raise ValueError(f"--seed {args.seed} applies to generators only, not to the trace {spec!r}")
        kw["skip_bad"] = args.skip_bad
        if _is_hash_id_trace(path):
            kw["limit"] = args.limit
            if args.vocab_size is not None:
                kw["vocab_size"] = args.vocab_size
        elif args.vocab_size is not None:
            raise ValueError(f"--vocab-size applies to generators and hash-id traces, not to "
                             f"the token trace {spec!r}")
    w = load_workload(spec, **kw)
    if args.limit is not None and len(w) > args.limit:
        w = Workload(w.name, w.requests[:args.limit], skipped=w.skipped,
                     block_size=w.block_size, meta=w.meta)
    return w


def _table(title: str, stats: list[ReplayStats]) -> Table:
    t = Table(title=title)
    t.add_column("")
    for s in stats:
        t.add_column(s.label, justify="right")
    rows = [("requests", lambda s: f"{s.requests:,}"),
            ("prompt tokens", lambda s: f"{s.prompt_tokens:,}"),
            ("hit tokens", lambda s: f"{s.hit_tokens:,}"),
            ("hit rate", lambda s: f"{s.hit_rate:.2%}"),
            ("evicted tokens", lambda s: f"{s.evicted_tokens:,}"),
            ("orphan blocks", lambda s: f"{s.orphan_blocks:,}"),
            ("duplicate blocks", lambda s: f"{s.duplicate_blocks:,}"),
            ("peak nodes/blocks", lambda s: f"{s.peak_nodes:,}"),
            ("CPU µs/request", lambda s: f"{s.cpu_us_per_request:,.0f}"),
            ("wall s", lambda s: f"{s.wall_s:.2f}")]
    for name, fmt in rows:
        t.add_row(name, *(fmt(s) for s in stats))
    return t


def run(args: argparse.Namespace) -> int:
    console = Console()
    capacity = None if args.capacity is None else parse_capacity(args.capacity, args.kv_bytes_per_token)
    configs = [CacheConfig(n, args.block_size if n == "blockhash" else args.page_size,
                           "lru" if n == "blockhash" else args.eviction, hash_algo=args.hash_algo)
               for n in args.cache]
    caches = [c.build() for c in configs]
    w = load(args)
    if not len(w):
        raise ValueError(f"workload {args.workload!r} has no requests")
    sizes = [pool_size(w.requests, c.page_size, capacity) for c in caches]   # fail before any run
    skipped = f", {w.skipped:,} bad lines skipped" if w.skipped else ""
    console.print(f"workload [bold]{w.name}[/]: {len(w):,} requests, {w.num_prompt_tokens:,} "
                  f"prompt tokens, {w.num_output_tokens:,} output tokens{skipped}")
    if capacity is None:
        span = "-".join(f"{n:,}" for n in sorted({min(sizes), max(sizes)}))
        console.print(f"capacity: unlimited (pool = all prompt + output tokens: {span})")
    else:
        per = f" at {args.kv_bytes_per_token:,} B/token" if args.kv_bytes_per_token else ""
        given = "" if args.capacity.strip() == str(capacity) else f"{args.capacity.strip()}{per} = "
        console.print(f"capacity: {given}{capacity:,} tokens")
    stats: list[ReplayStats] = []
    show = console.is_terminal and len(w) > PROGRESS_MIN_REQUESTS
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True, disable=not show) as bar:
        for c in caches:
            task = bar.add_task(c.label, total=len(w))
            stats.append(replay(w.requests, c, capacity,
                                progress=lambda n, task=task: bar.update(task, completed=n)))
    console.print(_table(f"replay: {w.name}", stats))
    if args.json is not None:
        args.json.write_text(json.dumps([s.to_json() for s in stats], indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0
