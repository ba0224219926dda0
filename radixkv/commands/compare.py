"""`radixkv compare`: the reference experiment — several cache/scheduler configurations on the
same arrivals through the simulated GPU — as one table, compare.json, compare.png and
timeline.png."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.commands.cost import cost_from_args, run_configs
from radixkv.commands.flags import add_config_flags, check_pool, parse_config_spec
from radixkv.commands.inputs import (add_arrivals_args, add_concurrency_arg, add_model_args,
                                     add_workload_args, arrivals_from_args, arrivals_meta,
                                     concurrency_from_args, load_from_args)
from radixkv.commands.output import (Outputs, check_dir_target, console, engine_row, metadata, pct,
                                     progress_bar, seconds, workload_info)
from radixkv.offline.simulate import REFERENCE, Named, compare, reference_configs
from radixkv.offline.plots.compare import plot_compare, plot_timeline

FILES = ("compare.json", "compare.png", "timeline.png")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "compare", help="run the reference comparison of cache designs on a simulated GPU",
        description="Run several configurations side by side on the same arrivals through the "
                    "engine and a simulated GPU; print a table, write compare.json, compare.png "
                    "and timeline.png. The scheduler flags apply to every configuration.")
    add_workload_args(p, default=REFERENCE.workload,
                      rate_default=f"{REFERENCE.rate:g} for {REFERENCE.workload}, else the "
                                   f"generator's")
    add_concurrency_arg(p)
    add_arrivals_args(p)
    add_model_args(p)
    add_config_flags(p, caches=None, scheduler=True,
                     max_total_tokens=f"{REFERENCE.max_total_tokens:,} for {REFERENCE.workload}, "
                                      f"else what the engine would allocate on the GPU")
    p.add_argument("--config", action="append", metavar="[NAME:]SPEC", default=None,
                   help="a configuration instead of the reference six, its keys the flag names "
                        "without '--', e.g. 'lpm16:cache=radix,page-size=16,"
                        "radix-eviction-policy=lfu,schedule-policy=lpm' (repeatable)")
    p.add_argument("--out", type=Path, default=Path("out"), metavar="DIR",
                   help=f"the folder for {', '.join(FILES)} (default: out)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_dir_target(args.out, "--out")
    clients = concurrency_from_args(args)
    arrivals = arrivals_from_args(args, clients)
    choice = cost_from_args(args)
    bpt = choice.kv_bytes_per_token
    rc = run_configs(args, choice, REFERENCE.pool(args.workload)
                     or choice.default_tokens(REFERENCE.max_total_tokens))
    capacity = rc.max_total_tokens
    if args.config:
        configs = []
        for spec in args.config:
            name, cache, sched = parse_config_spec(spec, rc.sched)
            configs.append(Named(name, rc.engine(cache, sched, name)))
    else:
        configs = reference_configs(capacity, rc.sched)
    for nc in configs:
        check_pool(nc.cfg)
    wl = load_from_args(args, generator_defaults=REFERENCE.generator_defaults(args.workload))
    con = console()
    rate = wl.meta.get("rate")
    gib = capacity * bpt / 2**30
    load = (f" over {wl.duration:.0f} s" + (f" (rate {rate:g}/s)" if rate else "")
            if clients is None else f"; closed loop, {clients} clients")
    load += "" if arrivals is None else f"; session arrivals, {arrivals.describe()}"
    con.print(f"workload [bold]{wl.name}[/]: {len(wl)} requests, {wl.num_prompt_tokens:,} prompt "
              f"tokens{load}")
    con.print(f"simulated {choice.model} on {choice.gpu} ({choice.timing}): KV pool "
              f"{choice.describe_pool(capacity)} ({gib:.1f} GiB); {len(configs)} configurations")

    t0 = time.perf_counter()
    with progress_bar(con) as bar:
        tasks = {nc.name: bar.add_task(nc.name, total=len(wl)) for nc in configs}
        results = compare(wl, configs, choice.cost,
                          progress=lambda name, k: bar.advance(tasks[name], k),
                          max_concurrency=clients, arrivals=arrivals)
    named = [(nc.name, rep) for nc, rep in results]
    rows = [rep.summary() for _, rep in named]

    loop = ("" if clients is None else f", {clients} clients") + \
        ("" if arrivals is None else f", session arrivals ({arrivals.describe()})")
    title = f"{wl.name}: {len(wl)} requests{loop}, KV {capacity:,} tokens, {choice.model} on " \
            f"{choice.gpu}"
    table = Table(title=title)
    for col in ("config", "hit rate", "prefill tok", "TTFT p50", "TTFT p99", "E2E p50",
                "E2E p99", "out tok/s", "evicted tok", "retractions"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        tput = r["throughput_tok_s"]
        table.add_row(r["name"], pct(r["hit_rate"]), f"{r['prefill_tokens']:,}",
                      seconds(r["ttft_p50"], 3), seconds(r["ttft_p99"]), seconds(r["e2e_p50"]),
                      seconds(r["e2e_p99"]), "-" if tput is None else f"{tput:,.0f}",
                      f"{r['evicted_tokens']:,}", str(r["retractions"]))
    con.print(table)

    paths = [args.out / f for f in FILES]
    with Outputs() as out:
        doc = metadata(workload_info(wl, args.workload), model=choice.model, gpu=choice.gpu,
                       max_total_tokens=capacity, results=[engine_row(r) for r in rows],
                       max_concurrency=clients, timing=choice.timing)
        out.write_json(paths[0], {**doc, **arrivals_meta(arrivals)})
        plot_title = f"{wl.name} · {len(wl)} requests · " + \
                     ("" if clients is None else f"{clients} clients · ") + \
                     ("" if arrivals is None else "session arrivals · ") + \
                     f"KV {capacity:,} tokens · {choice.model} on {choice.gpu}"
        plot_compare(named, out.path(paths[1]), plot_title)
        plot_timeline(named, out.path(paths[2]), plot_title)
    con.print(f"wrote {', '.join(map(str, paths))} in {time.perf_counter() - t0:.0f} s")
    return 0
