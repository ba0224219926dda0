"""`radixkv simulate`: one configuration through the engine on a simulated GPU, full report."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.commands.cost import cost_from_args, run_configs
from radixkv.commands.flags import add_config_flags, check_pool
from radixkv.commands.inputs import (add_arrivals_args, add_concurrency_arg, add_model_args,
                                     add_workload_args, arrivals_from_args, arrivals_label,
                                     arrivals_meta, concurrency_from_args, load_from_args)
from radixkv.commands.output import (Outputs, advance_by, check_file_target, console, engine_row,
                                     metadata, pct, progress_bar, unit_of, workload_info)
from radixkv.offline.simulate import REFERENCE, run_config


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "simulate", help="simulate one configuration and print its report",
        description="Run one cache/scheduler configuration through the engine on a simulated "
                    "GPU and print its report. The default run is compare's: the support "
                    f"workload at {REFERENCE.rate:g} sessions/s with a KV pool of "
                    f"{REFERENCE.max_total_tokens:,} tokens.")
    add_workload_args(p, default=REFERENCE.workload,
                      rate_default=f"{REFERENCE.rate:g} for {REFERENCE.workload}, else the "
                                   f"generator's")
    add_concurrency_arg(p)
    add_arrivals_args(p)
    add_model_args(p)
    add_config_flags(p, caches="one", scheduler=True,
                     max_total_tokens=f"{REFERENCE.max_total_tokens:,} for {REFERENCE.workload}, "
                                      f"else what the engine would allocate on the GPU")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write the summary, with the run's metadata, as JSON")
    p.set_defaults(func=run)


def _cell(key: str, v: Any) -> str:
    if v is None:
        return "-"
    unit = unit_of(key)
    if unit == "fraction":
        return pct(v)
    if unit == "s":
        return f"{v:,.4g} s"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def run(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_file_target(args.json, "--json")
    clients = concurrency_from_args(args)
    arrivals = arrivals_from_args(args, clients)
    choice = cost_from_args(args)
    rc = run_configs(args, choice, REFERENCE.pool(args.workload)
                     or choice.default_tokens(REFERENCE.max_total_tokens))
    cfg = rc.engine(rc.caches[0])
    check_pool(cfg)
    wl = load_from_args(args, generator_defaults=REFERENCE.generator_defaults(args.workload))
    con = console()
    with progress_bar(con) as bar:
        rep = run_config(wl, cfg, choice.cost, progress=advance_by(bar, cfg.label, len(wl)),
                         max_concurrency=clients, arrivals=arrivals)
    s = rep.summary()
    loop = ("" if clients is None else f" · {clients} clients") + arrivals_label(arrivals)
    table = Table(title=f"{cfg.label} · {wl.name} ({len(wl)} requests){loop} · "
                        f"{choice.describe_pool(cfg.kv_capacity)} · {choice.model} on "
                        f"{choice.gpu} ({choice.timing})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in s.items():
        table.add_row(k, _cell(k, v))
    con.print(table)
    if args.json is not None:
        with Outputs() as out:
            doc = metadata(workload_info(wl, args.workload), model=choice.model, gpu=choice.gpu,
                           max_total_tokens=cfg.kv_capacity, results=[engine_row(s)],
                           max_concurrency=clients, timing=choice.timing)
            out.write_json(args.json, {**doc, **arrivals_meta(arrivals)})
        con.print(f"wrote {args.json}")
    return 0
