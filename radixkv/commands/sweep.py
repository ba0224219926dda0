"""`radixkv sweep`: hit rate against KV memory for each cache and eviction order, as a table
(optionally JSON and a plot), to size a KV pool for a workload."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.commands.flags import BLOCK_SIZE, CACHE_FLAGS, SCHED_FLAGS, _add, cache_config
from radixkv.commands.inputs import add_workload_args, load_from_args
from radixkv.commands.output import (Outputs, check_file_target, console, metadata, pct,
                                     progress_bar, workload_info)
from radixkv.offline.planning.sweep import SweepRow, ceiling, lines_of, sweep
from radixkv.offline.plots.sweep import format_need, needed, smallest
from radixkv.sim.specs import MODEL_SPECS
from radixkv.argcheck import parse_capacity

DEFAULT_POINTS = 24
SWEEP_CACHES = ("radix", "blockhash")
# the cache options a sweep takes (the hash never changes a hit)
_OPTIONS = ("page_size", "eviction", "slru_threshold", "evict_granularity")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "sweep", help="hit rate against KV memory, per cache and eviction order",
        description="Replay a workload through each cache at a range of KV pool sizes and "
                    "show the hit rate at each: LRU curves exactly in one pass, other orders "
                    "and belady one replay per size, over all cores. Sizes too small for the "
                    "largest request are shown as '-' (null in JSON).")
    add_workload_args(p)
    g = p.add_argument_group("prefix cache")
    g.add_argument("--cache", dest="kind", nargs="+", choices=SWEEP_CACHES, metavar="NAME",
                   help=f"prefix caches to sweep: {', '.join(SWEEP_CACHES)} (default: both)")
    _add(g, CACHE_FLAGS["page_size"])
    g.add_argument("--block-size", type=int, metavar="N",
                   help=f"tokens per block of the blockhash cache (default: {BLOCK_SIZE})")
    _add(g, CACHE_FLAGS["eviction"], help="radix eviction orders to sweep (belady: the "
         "future-aware oracle)", nargs="+", default="lru")
    _add(g, CACHE_FLAGS["slru_threshold"])
    _add(g, CACHE_FLAGS["evict_granularity"], default="page: LRU in one pass; node is replayed")
    g = p.add_argument_group("KV pool sizes")
    sizes = g.add_mutually_exclusive_group()
    sizes.add_argument("--points", type=int, metavar="N",
                       help=f"sizes log-spaced from the largest request to the unlimited "
                            f"cache's footprint (default: {DEFAULT_POINTS})")
    sizes.add_argument("--capacities", nargs="+", metavar="TOKENS|SIZE",
                       help="these sizes instead: tokens, or byte sizes such as 8GiB (with "
                            "--model), rounded down to whole pages")
    g.add_argument("--model", choices=sorted(MODEL_SPECS), metavar="NAME",
                   help=f"show sizes in GiB at this model's KV bytes per token: "
                        f"{', '.join(sorted(MODEL_SPECS))} (default: tokens only)")
    g.add_argument("--workers", type=int, metavar="N",
                   help="processes for the replays (default: the CPU cores)")
    _add(p.add_argument_group("workload seed"), SCHED_FLAGS["seed"],
         help="seed of the workload generator")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write the rows, with the run's metadata, as JSON")
    p.add_argument("--plot", type=Path, metavar="OUT.png",
                   help="also draw hit rate against KV memory")
    p.set_defaults(func=run)


def _lines(args: argparse.Namespace):
    """The curves the flags ask for, validated with the flags' own names in any error."""
    kinds = args.kind or list(SWEEP_CACHES)
    evictions = args.eviction or ["lru"]
    granularity = args.evict_granularity or "page"
    radix_only = [CACHE_FLAGS[n].flag for n in _OPTIONS if getattr(args, n) is not None]
    if "radix" not in kinds and radix_only:
        raise ValueError(f"{', '.join(radix_only)} appl{'ies' if len(radix_only) == 1 else 'y'} "
                         f"to the radix cache, not to {' or '.join(kinds)}")
    if args.block_size is not None and "blockhash" not in kinds:
        raise ValueError("--block-size applies to the blockhash cache; radix takes --page-size")
    given = {n: getattr(args, n) for n in ("page_size", "slru_threshold")
             if getattr(args, n) is not None}
    for k in kinds:
        for e in (evictions if k == "radix" else ["lru"]):
            cache_config(k, {**given, "eviction": e, "evict_granularity": granularity}
                         if k == "radix" else {}, args.block_size)
    ps = args.page_size or CACHE_FLAGS["page_size"].default
    bs = BLOCK_SIZE if args.block_size is None else args.block_size
    slru = args.slru_threshold or CACHE_FLAGS["slru_threshold"].default
    return kinds, evictions, ps, bs, granularity, slru


def _capacities(args: argparse.Namespace, bpt: int | None) -> list[int] | None:
    if args.capacities is None:
        return None
    out = []
    for text in args.capacities:
        try:
            out.append(parse_capacity(text, bpt))
        except ValueError as e:
            if bpt is None and "byte size" in str(e):
                raise ValueError(f"--capacities {text!r} is a byte size: give --model to turn "
                                 f"it into tokens") from None
            raise ValueError(f"--capacities: {e}") from None
    return out


def _table(title: str, rows: list[SweepRow], in_bytes: bool) -> Table:
    t = Table(title=title)
    t.add_column("KV pool (tokens)", justify="right")
    if in_bytes:
        t.add_column("GiB", justify="right")
    names = list(dict.fromkeys(r.line for r in rows))
    for n in names:
        method = next(r.method for r in rows if r.line == n)
        t.add_column(f"{n}\n({method})", justify="right")
    by = {(r.line, r.capacity_tokens): r for r in rows}
    for cap in sorted({r.capacity_tokens for r in rows}):
        cells = [f"{cap:,}"]
        if in_bytes:
            any_row = next(r for r in rows if r.capacity_tokens == cap)
            cells.append(f"{any_row.capacity_bytes / 2**30:.2f}")
        cells += [pct(by[n, cap].hit_rate) if (n, cap) in by else "" for n in names]
        t.add_row(*cells)
    return t


def run(args: argparse.Namespace) -> int:
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if path is not None:
            check_file_target(path, flag)
    if args.points is not None and args.points < 1:
        raise ValueError(f"--points must be at least 1, got {args.points}")
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    kinds, evictions, ps, bs, granularity, slru = _lines(args)
    lines = lines_of(kinds, evictions, ps, bs, granularity, slru)
    bpt = None if args.model is None else MODEL_SPECS[args.model].kv_bytes_per_token_per_gpu
    capacities = _capacities(args, bpt)
    w = load_from_args(args, seed_for_traces=False)
    con = console()
    skipped = f", {w.skipped:,} bad lines skipped" if w.skipped else ""
    con.print(f"workload [bold]{w.name}[/]: {len(w):,} requests, {w.num_prompt_tokens:,} "
              f"prompt tokens, {w.num_output_tokens:,} output tokens{skipped}")
    t0 = time.perf_counter()
    ceilings = {}
    for ln in lines:
        if (ln.cache, ln.page_size) not in ceilings:
            ceilings[ln.cache, ln.page_size] = ceiling(w, ln.cache, ln.page_size)
    with progress_bar(con) as bar:
        task = bar.add_task("sweep", total=None)
        rows = sweep(w, kinds, evictions, ps, bs, capacities=capacities,
                     points=None if capacities else (args.points or DEFAULT_POINTS),
                     model=args.model, granularity=granularity, slru_threshold=slru,
                     workers=args.workers,
                     progress=lambda done, total: bar.update(task, completed=done, total=total))
    wall = time.perf_counter() - t0
    top = max(ceilings.values())
    in_bytes = bpt is not None
    con.print(_table(f"sweep: {w.name}, hit rate by KV pool"
                     + (f" ({args.model}, {bpt:,} B/token)" if bpt else ""), rows, in_bytes))
    unlimited = ", ".join(f"{k} p{p}: {pct(v)}" if k == "radix" else f"{k} b{p}: {pct(v)}"
                          for (k, p), v in ceilings.items())
    con.print(f"unlimited cache: {unlimited}")
    need, first = needed(rows, top, in_bytes), smallest(rows, in_bytes)
    con.print(f"memory for a share of the {pct(top)} ceiling (the smallest swept pool that "
              f"reaches it):")
    for name, by_share in need.items():
        parts = ", ".join(f"{s:.0%}: {format_need(x, first[name], in_bytes)}"
                          for s, x in by_share.items())
        con.print(f"  {name}: {parts}")
    con.print(f"{len(rows)} points in {wall:.1f} s")
    if args.json is None and args.plot is None:
        return 0
    with Outputs() as out:
        if args.json is not None:
            results = [r.to_json() for r in rows]
            doc = metadata(workload_info(w, args.workload), model=args.model, gpu=None,
                           max_total_tokens=max(r.capacity_tokens for r in rows),
                           results=results)
            if "capacity_bytes" in doc["units"]:
                doc["units"]["capacity_bytes"] = "bytes"
            doc["sweep"] = {
                "evict_granularity": granularity,
                "kv_bytes_per_token": bpt,
                "ceiling": {r.line: ceilings[r.cache, r.page_size] for r in rows},
                "ceiling_plotted": top,
                "capacity_tokens_for_share_of_ceiling": {
                    name: {f"{s:g}": None if x is None else int(x) for s, x in by.items()}
                    for name, by in needed(rows, top, in_bytes=False).items()},
            }
            out.write_json(args.json, doc)
        if args.plot is not None:
            from radixkv.offline.plots.sweep import plot_sweep
            title = (f"{w.name}: {len(w):,} requests, {w.num_prompt_tokens:,} prompt tokens"
                     + (f" · {args.model}, {bpt:,} B/token of KV" if bpt else ""))
            plot_sweep(rows, out.path(args.plot), title, top)
    con.print("wrote " + ", ".join(str(p) for p in (args.json, args.plot) if p is not None))
    return 0
