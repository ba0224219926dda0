"""`radixkv four-way`: one shared-prefix workload served by four `radixkv serve` configurations
(default, lpm-slru, page16, no-cache) over HTTP; what each client saw (latency, throughput,
cached tokens in usage) beside what each server counted (/metrics: prefix-cache queries and
hits, evicted tokens, retractions), as a table, four_way.json and four_way.png."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.bench.client import BenchConfig, run_benchmark
from radixkv.bench.four_way import CONFIGS, DEFAULT_MODEL, FEWSHOT, make_fewshot_workload, make_row
from radixkv.bench.process import ServerProcess, scrape_metrics
from radixkv.commands.bench_serve import cell, finite_or_str
from radixkv.commands.output import (Outputs, advance_by, check_dir_target, console, metadata, pct,
                                     progress_bar, workload_info)
from radixkv.offline.plots.four_way import plot
from radixkv.shapes import MODEL_CONFIGS
from radixkv.sim.specs import GPU_SPECS
from radixkv.argcheck import positive_int
from radixkv.workloads import GENERATORS


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "four-way", help="one workload against four radixkv serve configurations, over HTTP",
        description="Start `radixkv serve` four times, one configuration at a time (one after "
                    "another, so the servers never share the machine's cores): default (fcfs, "
                    "page 1, lru), lpm-slru (--schedule-policy lpm --radix-eviction-policy "
                    "slru), page16 (--page-size 16) and no-cache (--disable-radix-cache). Each "
                    "gets the same shared-prefix workload through the bench-serve client; its "
                    "/metrics counters give the hit rate and the prefill tokens computed. Writes "
                    "DIR/four_way.json and DIR/four_way.png, both or neither.")
    p.add_argument("--executor", choices=("torch", "sim"), default="sim",
                   help="the server's executor (default: sim)")
    p.add_argument("--model", metavar="NAME",
                   help=f"the served model: {', '.join(MODEL_CONFIGS)} (default: tiny-llama "
                        f"with torch, llama-3-8b with sim)")
    p.add_argument("--gpu", choices=sorted(GPU_SPECS), metavar="NAME",
                   help="the simulated GPU, with --executor sim (default: the server's)")
    p.add_argument("--workload", choices=sorted(GENERATORS), default="fewshot", metavar="NAME",
                   help="a generator (default: fewshot: prompts behind one long preamble; for a "
                        "byte-level model " + _sizes("small") + "; else " + _sizes("large") + ")")
    p.add_argument("--preambles", type=int, default=1, metavar="K",
                   help="fewshot: K different preambles, their questions interleaved at random "
                        "(default: 1); with a KV pool smaller than all K preambles, the queue "
                        "order decides what stays cached")
    p.add_argument("--num-prompts", type=int, metavar="N",
                   help="requests (default: the sizes above; other generators: all of theirs)")
    p.add_argument("--request-rate", type=float, default=math.inf, metavar="R",
                   help="Poisson arrivals at R requests/s; inf: all at once (default: inf)")
    p.add_argument("--max-total-tokens", type=int, metavar="N",
                   help="each server's KV pool in tokens (default: the server's)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the generator (default: 0)")
    p.add_argument("--startup-timeout", type=float, default=180.0, metavar="S",
                   help="seconds a server may take to listen (default: 180)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds one request may take (default: 600)")
    p.add_argument("--out-dir", type=Path, default=Path("out"), metavar="DIR",
                   help="where four_way.json and four_way.png go (default: out)")
    p.set_defaults(func=run)


def _sizes(size: str) -> str:
    f = FEWSHOT[size]
    return (f"{f['num_questions']} questions, a {f['preamble_len']}-token preamble, outputs of "
            f"{f['output_len'][0]}-{f['output_len'][1]} tokens, vocab {f['vocab_size']}")


COLUMNS = [("config", "name"), ("requests", "requests"), ("errors", "errors"),
           ("prompt tok", "prompt_tokens"), ("cached tok (usage)", "cached_tokens"),
           ("hit rate", "hit_rate"), ("prefill tok", "prefill_tokens"),
           ("evicted tok", "evicted_tokens"), ("retractions", "retractions"),
           ("TTFT p50", "ttft_p50"), ("TTFT p99", "ttft_p99"), ("E2E p99", "e2e_p99"),
           ("out tok/s", "output_tok_s")]


def rows_table(rows: list[dict], title: str) -> Table:
    table = Table(title=title)
    for i, (head, _) in enumerate(COLUMNS):
        table.add_column(head, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(row["name"] if key == "name" else cell(key, row[key], rate_unit=False)
                        for _, key in COLUMNS))
    return table


def run(args: argparse.Namespace) -> int:
    out_dir = check_dir_target(args.out_dir, "--out-dir")
    model = args.model or DEFAULT_MODEL[args.executor]
    if args.gpu is not None and args.executor != "sim":
        raise ValueError(f"--gpu {args.gpu} applies to --executor sim, not {args.executor}")
    num = None if args.num_prompts is None else positive_int(args.num_prompts, "--num-prompts")
    if not args.request_rate > 0:
        raise ValueError(f"--request-rate {args.request_rate!r} is not a positive number (or inf)")
    wl = make_fewshot_workload(args.workload, model, num, args.request_rate, args.seed,
                               args.preambles)
    server_args = ["--model", model, "--executor", args.executor, "--enable-metrics"]
    server_args += [] if args.gpu is None else ["--gpu", args.gpu]
    if args.max_total_tokens is not None:
        server_args += ["--max-total-tokens",
                        str(positive_int(args.max_total_tokens, "--max-total-tokens"))]
    con = console()
    rows = []
    for name, flags in CONFIGS.items():
        with ServerProcess(server_args + flags, startup_timeout=args.startup_timeout) as srv:
            before = scrape_metrics(srv.base_url)
            with progress_bar(con) as bar:
                result = run_benchmark(wl, BenchConfig(srv.base_url, timeout=args.timeout),
                                       progress=advance_by(bar, name, len(wl)))
            after = scrape_metrics(srv.base_url)
        r = make_row(name, result, before, after)
        rows.append(r)
        con.print(f"{name}: {r['completed']}/{r['requests']} completed, {r['errors']} errors, "
                  f"hit rate {pct(r['hit_rate'])}, {result.summary['duration_s']:.1f} s")
    rate = "all at once" if math.isinf(args.request_rate) else f"{args.request_rate:g} req/s"
    title = f"{wl.name} ({len(wl)} requests, {rate}) · {model} on {args.executor}" + \
        (f" ({args.gpu})" if args.gpu else "")
    con.print(rows_table(rows, title))
    doc = metadata(workload_info(wl, args.workload), model=model, gpu=args.gpu,
                   max_total_tokens=args.max_total_tokens, results=rows)
    doc.update(executor=args.executor, request_rate=finite_or_str(args.request_rate))
    with Outputs() as out:
        out.write_json(out_dir / "four_way.json", doc)
        plot(rows, out.path(out_dir / "four_way.png"), title)
    con.print(f"wrote {out_dir / 'four_way.json'} and {out_dir / 'four_way.png'}")
    return 0 if all(r["completed"] for r in rows) else 1
