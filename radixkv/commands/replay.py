"""`radixkv replay`: replay a trace or a generated workload through one or more caches, side
by side on the same requests, and print one table (optionally a JSON file)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.cache.pool import SlotPool
from radixkv.commands.flags import add_config_flags, configs_from_args, whole_pages
from radixkv.commands.inputs import add_workload_args, load_from_args
from radixkv.commands.output import (Outputs, check_file_target, console, metadata, pct,
                                     progress_bar, workload_info)
from radixkv.offline.replay import ReplayStats, pool_size, replay
from radixkv.sim.specs import MODEL_SPECS

PROGRESS_MIN_REQUESTS = 500


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "replay", help="replay a trace or generated workload through caches side by side",
        description="Replay requests one at a time in arrival order through each cache (same "
                    "workload, loaded once) and compare hit rate, eviction and CPU cost.")
    add_workload_args(p)
    add_config_flags(p, caches="many", scheduler=False, max_total_tokens="unlimited")
    g = p.add_argument_group("KV bytes per token, for a byte-size --max-total-tokens")
    g.add_argument("--kv-bytes-per-token", type=int, metavar="N",
                   help="KV bytes one token takes (default: none; byte sizes need it or --model)")
    g.add_argument("--model", choices=sorted(MODEL_SPECS), metavar="NAME",
                   help=f"take the KV bytes per token of a model: "
                        f"{', '.join(sorted(MODEL_SPECS))} (default: none)")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write the results, with the run's metadata, as JSON")
    p.set_defaults(func=run)


def _table(title: str, stats: list[ReplayStats]) -> Table:
    t = Table(title=title)
    t.add_column("")
    for s in stats:
        t.add_column(s.label, justify="right")
    rows = [("requests", lambda s: f"{s.requests:,}"),
            ("prompt tokens", lambda s: f"{s.prompt_tokens:,}"),
            ("hit tokens", lambda s: f"{s.hit_tokens:,}"),
            ("hit rate", lambda s: pct(s.hit_rate)),
            ("evicted tokens", lambda s: f"{s.evicted_tokens:,}"),
            ("orphan blocks", lambda s: f"{s.orphan_blocks:,}"),
            ("duplicate blocks", lambda s: f"{s.duplicate_blocks:,}"),
            ("peak nodes/blocks", lambda s: f"{s.peak_nodes:,}"),
            ("CPU µs/request", lambda s: f"{s.cpu_us_per_request:,.0f}"),
            ("wall s", lambda s: f"{s.wall_s:.2f}")]
    for name, fmt in rows:
        t.add_row(name, *(fmt(s) for s in stats))
    return t


def _kv_bytes_per_token(args: argparse.Namespace) -> int | None:
    if args.kv_bytes_per_token is not None and args.model is not None:
        raise ValueError("give --kv-bytes-per-token or --model, not both")
    if args.model is not None:
        return MODEL_SPECS[args.model].kv_bytes_per_token_per_gpu
    return args.kv_bytes_per_token


def run(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_file_target(args.json, "--json")
    bpt = _kv_bytes_per_token(args)
    rc = configs_from_args(args, kv_bytes_per_token=bpt, default_tokens=None)
    capacity = rc.max_total_tokens
    caches = [c.build() for c in rc.caches]
    if capacity is not None:                  # a pool the machine cannot hold: before loading
        for c in rc.caches:
            SlotPool(whole_pages(capacity, c.page_size), c.page_size)
    w = load_from_args(args, seed_for_traces=False)
    sizes = [pool_size(w.requests, c.page_size, capacity) for c in caches]   # fail before any run
    con = console()
    skipped = f", {w.skipped:,} bad lines skipped" if w.skipped else ""
    con.print(f"workload [bold]{w.name}[/]: {len(w):,} requests, {w.num_prompt_tokens:,} "
              f"prompt tokens, {w.num_output_tokens:,} output tokens{skipped}")
    if capacity is None:
        span = "-".join(f"{n:,}" for n in sorted({min(sizes), max(sizes)}))
        con.print(f"KV pool: unlimited (all prompt + output tokens: {span})")
    else:
        text = args.kv_capacity.strip()
        per = f" at {bpt:,} B/token" if bpt else ""
        given = "" if text == str(capacity) else f"{text}{per} = "
        con.print(f"KV pool: {given}{capacity:,} tokens")
    stats: list[ReplayStats] = []
    with progress_bar(con, show=len(w) > PROGRESS_MIN_REQUESTS) as bar:
        for c in caches:
            task = bar.add_task(c.label, total=len(w))
            stats.append(replay(w.requests, c, capacity, check=rc.check_invariants,
                                progress=lambda n, task=task: bar.update(task, completed=n)))
    con.print(_table(f"replay: {w.name}", stats))
    if args.json is not None:
        with Outputs() as out:
            out.write_json(args.json, metadata(workload_info(w, args.workload), model=args.model,
                                               gpu=None, max_total_tokens=capacity,
                                               results=[s.to_json() for s in stats]))
        con.print(f"wrote {args.json}")
    return 0
