"""`radixkv cluster`: N simulated replicas behind each router named, on the same arrivals; one
row per router (hit rate, prefill, TTFT, end-to-end, throughput, imbalance, eviction)."""
from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.commands.cost import CostChoice, cost_from_args, run_configs
from radixkv.commands.flags import add_config_flags, check_pool
from radixkv.commands.inputs import (add_arrivals_args, add_model_args, add_workload_args,
                                     arrivals_from_args, arrivals_label, arrivals_meta,
                                     load_from_args)
from radixkv.commands.output import (Outputs, check_file_target, console, metadata, pct,
                                     progress_bar, workload_info)
from radixkv.offline.simulate import REFERENCE
from radixkv.router import ROUTERS
from radixkv.offline.cluster.simulator import ClusterConfig
from radixkv.offline.cluster.disagg import DECODE_ROUTER, DisaggConfig, decode_engine
from radixkv.sim.kv_links import DEFAULT_KV_LINK, KV_LINKS
from radixkv.offline.cluster.compare import run_routers
from radixkv.router.options import parse_router_options
from radixkv.offline.cluster.results import ClusterResult
from radixkv.argcheck import positive_int

# KV per replica on a profile's device (a named GPU gets the engine's own allocation): ~48.8
# GiB of Llama-3-8B KV, about what an 80 GB GPU keeps after the weights
REPLICA_TOKENS = 400_000
REPLICAS = 8
PAGE_SIZE = 16                # the radix cache's page when --page-size is not given
DEFAULT_ROUTERS = ("round-robin", "power-of-two", "sglang-cache-aware", "ray-prefix-affinity",
                   "llm-d-precise", "radixkv")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "cluster", help="simulate N replicas behind each router and compare the routers",
        description="Run the workload through N simulated replicas (each its own engine, "
                    "cache and GPU) behind each router named, on the same arrivals, and print "
                    "one row per router.")
    add_workload_args(p, rate_default=f"{REFERENCE.rate:g} for {REFERENCE.workload}, else the "
                                       f"generator's")
    add_arrivals_args(p)
    add_model_args(p)
    add_config_flags(p, caches="one", scheduler=True,
                     max_total_tokens="per replica, what the engine would allocate on the GPU")
    g = p.add_argument_group("cluster")
    g.add_argument("--replicas", type=int, metavar="N",
                   help=f"replicas behind the router (default: {REPLICAS})")
    g.add_argument("--router", nargs="+", metavar="NAME", default=list(DEFAULT_ROUTERS),
                   help=f"routers to compare: {', '.join(ROUTERS)} (default: "
                        f"{' '.join(DEFAULT_ROUTERS)})")
    g.add_argument("--workers", type=int, metavar="N",
                   help="processes running routers side by side (default: one per CPU)")
    g = p.add_argument_group(
        "disaggregated prefill and decode",
        "prefill workers (behind --router, holding the prefix cache) send each request's KV "
        "over --kv-link to decode workers (behind --decode-router)")
    g.add_argument("--prefill-replicas", type=int, metavar="N", help="prefill workers")
    g.add_argument("--decode-replicas", type=int, metavar="N", help="decode workers")
    g.add_argument("--kv-link", metavar="NAME",
                   help=f"the link KV moves over: {', '.join(KV_LINKS)} (default: "
                        f"{DEFAULT_KV_LINK})")
    g.add_argument("--decode-router", metavar="NAME",
                   help=f"how a decode worker is chosen: any router (default: {DECODE_ROUTER})")
    p.add_argument("--router-option", action="append", default=[], metavar="ROUTER.FIELD=VALUE",
                   help="set one of a named router's options (repeatable), e.g. "
                        "radixkv.work_weight=8 or llm-d-precise.queue_weight=1")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write the rows, with the run's metadata, as JSON")
    p.add_argument("--plot", type=Path, metavar="PNG", help="also draw the rows (cluster.png)")
    p.set_defaults(func=run)


def cluster_config(args: argparse.Namespace, choice: CostChoice
                   ) -> ClusterConfig | DisaggConfig:
    """The replicas' configuration from the flags; the radix and none caches use pages of
    PAGE_SIZE tokens unless --page-size or --engine says otherwise. With --prefill-replicas
    and --decode-replicas, a disaggregated cluster of that engine."""
    rc = run_configs(args, choice, choice.default_tokens(REPLICA_TOKENS))
    cache = rc.caches[0]
    if args.page_size is None and cache.kind != "blockhash" and args.engine is None:
        cache = replace(cache, page_size=PAGE_SIZE)
    cfg = rc.engine(cache)
    check_pool(cfg)
    pre, dec = args.prefill_replicas, args.decode_replicas
    if pre is None and dec is None:
        for flag, v in (("--kv-link", args.kv_link), ("--decode-router", args.decode_router)):
            if v is not None:
                raise ValueError(f"{flag} {v} applies to a disaggregated cluster "
                                 f"(--prefill-replicas and --decode-replicas)")
        n = REPLICAS if args.replicas is None else args.replicas
        return ClusterConfig(cfg, positive_int(n, "--replicas"), rc.seed)
    if pre is None or dec is None:
        raise ValueError("a disaggregated cluster needs both --prefill-replicas and "
                         "--decode-replicas")
    if args.replicas is not None:
        raise ValueError(f"--replicas {args.replicas} conflicts with --prefill-replicas and "
                         f"--decode-replicas")
    return DisaggConfig(cfg, decode_engine(cfg), positive_int(pre, "--prefill-replicas"),
                        positive_int(dec, "--decode-replicas"),
                        args.kv_link or DEFAULT_KV_LINK, args.decode_router or DECODE_ROUTER,
                        rc.seed)


def describe(config: ClusterConfig | DisaggConfig) -> str:
    if isinstance(config, DisaggConfig):
        return (f"{config.prefill_replicas} prefill + {config.decode_replicas} decode replicas "
                f"({config.link}, decode by {config.decode_router})")
    return f"{config.replicas} replicas"


def cluster_meta(config: ClusterConfig | DisaggConfig) -> dict:
    if isinstance(config, DisaggConfig):
        return {"replicas": config.replicas, "prefill_replicas": config.prefill_replicas,
                "decode_replicas": config.decode_replicas, "kv_link": config.link,
                "decode_router": config.decode_router}
    return {"replicas": config.replicas}


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:,.3f} s"


def table(results: list[ClusterResult], title: str) -> Table:
    t = Table(title=title)
    for col in ("router", "hit rate", "prefill tokens", "TTFT p50", "TTFT p99", "ITL p99",
                "e2e p99", "throughput tok/s", "imbalance", "evicted tokens"):
        t.add_column(col, justify="left" if col == "router" else "right")
    for r in results:
        tput = "-" if r.throughput_tok_s is None else f"{r.throughput_tok_s:,.0f}"
        t.add_row(r.router, pct(r.hit_rate), f"{r.prefill_tokens:,}", _s(r.ttft_p50),
                  _s(r.ttft_p99), _s(r.details.get("itl_p99")), _s(r.e2e_p99), tput, f"{r.imbalance:.2f}",
                  f"{r.evicted_tokens:,}")
    return t


def run(args: argparse.Namespace) -> int:
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if path is not None:
            check_file_target(path, flag)
    arrivals = arrivals_from_args(args)
    if args.workers is not None:
        positive_int(args.workers, "--workers")
    for name in args.router:
        ROUTERS.get(name)
    if len(set(args.router)) != len(args.router):
        raise ValueError(f"--router names a router twice: {' '.join(args.router)}")
    options = parse_router_options(args.router_option, args.router)
    choice = cost_from_args(args)
    config = cluster_config(args, choice)
    if arrivals is not None and isinstance(config, DisaggConfig):
        raise ValueError("session arrivals are not simulated on a disaggregated cluster; its "
                         "requests arrive at their trace times")
    wl = load_from_args(args, generator_defaults=REFERENCE.generator_defaults(args.workload))
    for tr in wl:                     # a request no replica could hold fails before any run
        need = len(tr.prompt) + max(tr.output_len, 1) + 1
        if need > config.engine.kv_capacity:
            raise ValueError(f"request {tr.id!r} needs about {need:,} KV slots but each replica "
                             f"has {config.engine.kv_capacity:,} (--max-total-tokens)")
    con = console()
    with progress_bar(con) as bar:
        task = bar.add_task("routers", total=len(args.router))
        results = run_routers(wl, config, args.router, choice.cost, args.workers,
                              done=lambda _: bar.advance(task), arrivals=arrivals,
                              options=options)
    title = (f"{wl.name} ({len(wl)} requests){arrivals_label(arrivals)} · {describe(config)} × "
             f"{choice.describe_pool(config.engine.kv_capacity)} ({config.engine.cache.label}) · "
             f"{choice.model} on {choice.gpu} ({choice.timing})")
    con.print(table(results, title))
    with Outputs() as out:
        if args.json is not None:
            doc = metadata(workload_info(wl, args.workload), model=choice.model, gpu=choice.gpu,
                           max_total_tokens=config.engine.kv_capacity, timing=choice.timing,
                           results=[r.row() for r in results])
            set_options = {k: asdict(v) for k, v in options.items()}
            out.write_json(args.json, {**doc, **cluster_meta(config), **arrivals_meta(arrivals),
                                       "router_options": set_options})
        if args.plot is not None:
            from radixkv.offline.plots.cluster import plot_cluster
            plot_cluster(results, out.path(args.plot), title)
    for path in (args.json, args.plot):
        if path is not None:
            con.print(f"wrote {path}")
    return 0
