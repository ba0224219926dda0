"""`radixkv simulate`: one configuration through the engine on a simulated GPU, full report."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import sys

from rich.console import Console
from rich.table import Table

from radixkv.commands._common import add_model_args, add_workload_args, capacity_from_args, load_from_args
from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.sched.policy import QUEUE_ORDERS, RETRACT_ORDERS
from radixkv.sim.costmodel import CostModel
from radixkv.simulate import run_config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("simulate", help="simulate one configuration and print its report",
                              description="Run one cache/scheduler configuration through the "
                                          "engine on a simulated GPU and print its report.")
    add_workload_args(p, default=None)
    add_model_args(p)
    p.add_argument("--cache", default="radix", help="radix | blockhash | none (default radix)")
    p.add_argument("--page-size", type=int, default=1, help="page (radix) or block (blockhash) size")
    p.add_argument("--eviction", default="lru", help="eviction order, or belady (oracle)")
    p.add_argument("--policy", default="fcfs", help=f"queue order: {', '.join(QUEUE_ORDERS)}")
    p.add_argument("--max-prefill-tokens", type=int, default=16384)
    p.add_argument("--chunked-prefill", type=int, default=8192, help="chunk size, 0 = off")
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--no-dedup", action="store_true", help="turn in-batch prefix dedup off")
    p.add_argument("--retract-policy", default="most-remaining", help=", ".join(RETRACT_ORDERS))
    p.add_argument("--retract-insert", action="store_true",
                   help="insert a retracted request's computed KV into the tree")
    p.add_argument("--check", action="store_true", help="check invariants after every step (slow)")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    wl = load_from_args(args)
    cfg = EngineConfig(
        kv_capacity=capacity_from_args(args, 200_000),
        cache=CacheConfig(args.cache, args.page_size, args.eviction),
        sched=SchedulerConfig(policy=args.policy, max_prefill_tokens=args.max_prefill_tokens,
                              chunked_prefill_size=args.chunked_prefill,
                              max_running_requests=args.max_running, dedup=not args.no_dedup,
                              retract_policy=args.retract_policy, retract_insert=args.retract_insert),
        check_invariants=args.check)
    rep = run_config(wl, cfg, CostModel.named(args.model, args.gpu))
    s = rep.summary()
    table = Table(title=f"{cfg.label} · {wl.name} ({len(wl)} requests) · KV {cfg.kv_capacity:,} "
                        f"tokens · {args.model} on {args.gpu}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in s.items():
        table.add_row(k, f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    if args.json:
        args.json.write_text(json.dumps(s, indent=2))
    return 0
