"""`radixkv compare`: the reference experiment — several cache/scheduler configurations on the
same arrivals through the simulated GPU — as one table, compare.json and compare.png."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from radixkv.commands._common import (add_model_args, add_workload_args, capacity_from_args,
                                      load_from_args, parse_config_spec)
from radixkv.config import EngineConfig, SchedulerConfig
from radixkv.sim.costmodel import CostModel
from radixkv.plot import plot_compare
from radixkv.simulate import Named, compare, reference_configs

# The default run: the support agent at a load and KV capacity where the queue backs up and
# eviction fires (1,200 requests, 4 sessions/s, 100,000 KV tokens ~ 12.2 GiB of Llama-3-8B KV).
DEFAULT_RATE = 4.0
DEFAULT_CAPACITY = 100_000
JSON_KEYS = ("name", "hit_rate", "prefill_tokens", "ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99",
             "throughput_tok_s", "evicted_tokens", "retractions")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="run the reference comparison of cache designs on a simulated GPU",
        description="Run several configurations side by side on the same arrivals through the "
                    "engine and a simulated GPU; print a table, write compare.json and compare.png.")
    add_workload_args(p)
    add_model_args(p)
    p.add_argument("--config", action="append", metavar="[NAME:]SPEC", default=None,
                   help="a configuration instead of the reference six, e.g. "
                        "'lpm16:cache=radix,page=16,eviction=lfu,policy=lpm' (repeatable)")
    p.add_argument("--out", type=Path, default=Path("out"), metavar="DIR",
                   help="where compare.json and compare.png go (default ./out)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    con = Console(width=None if sys.stdout.isatty() else 160)
    defaults = {"rate": DEFAULT_RATE} if args.workload == "support" else {}
    wl = load_from_args(args, defaults)
    capacity = capacity_from_args(args, DEFAULT_CAPACITY)
    cost = CostModel.named(args.model, args.gpu)
    if args.config:
        configs = []
        for spec in args.config:
            name, cache, sched_kw = parse_config_spec(spec)
            configs.append(Named(name, EngineConfig(kv_capacity=capacity, cache=cache,
                                                    sched=SchedulerConfig(**sched_kw), name=name)))
    else:
        configs = reference_configs(capacity)
    rate = wl.meta.get("rate")
    gib = capacity * cost.model_spec.kv_bytes_per_token_per_gpu / 2**30
    con.print(f"workload [bold]{wl.name}[/]: {len(wl)} requests, {wl.num_prompt_tokens:,} prompt "
              f"tokens over {wl.duration:.0f} s" + (f" (rate {rate:g}/s)" if rate else ""))
    con.print(f"simulated {args.model} on {args.gpu}: KV capacity {capacity:,} tokens "
              f"({gib:.1f} GiB); {len(configs)} configurations")

    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description:<26}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=con, transient=True) as bar:
        tasks = {nc.name: bar.add_task(nc.name, total=len(wl)) for nc in configs}
        results = compare(wl, configs, cost, progress=lambda name, k: bar.advance(tasks[name], k))
    rows = [rep.summary() for _, rep in results]

    table = Table(title=f"{wl.name}: {len(wl)} requests, KV {capacity:,} tokens, "
                        f"{args.model} on {args.gpu}")
    for col in ("config", "hit rate", "prefill tok", "TTFT p50", "TTFT p99", "E2E p50",
                "E2E p99", "out tok/s", "evicted tok", "retractions"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        table.add_row(r["name"], f"{r['hit_rate']:.3f}", f"{r['prefill_tokens']:,}",
                      f"{r['ttft_p50']:.3f}s", f"{r['ttft_p99']:.2f}s", f"{r['e2e_p50']:.2f}s",
                      f"{r['e2e_p99']:.2f}s", f"{r['throughput_tok_s']:,.0f}",
                      f"{r['evicted_tokens']:,}", str(r["retractions"]))
    con.print(table)

    args.out.mkdir(parents=True, exist_ok=True)
    jpath = args.out / "compare.json"
    jpath.write_text(json.dumps([{k: r[k] for k in JSON_KEYS} | {"details": r} for r in rows],
                                indent=2))
    ppath = plot_compare(rows, [[x.ttft for x in rep.records] for _, rep in results],
                         args.out / "compare.png",
                         title=f"{wl.name} · {len(wl)} requests · KV {capacity:,} tokens · "
                               f"{args.model} on {args.gpu}")
    con.print(f"wrote {jpath} and {ppath} in {time.perf_counter() - t0:.0f} s")
    return 0
