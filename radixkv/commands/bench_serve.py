"""`radixkv bench-serve`: replay a workload against a running OpenAI-compatible server
(radixkv serve, SGLang, vLLM) and report what it measured: latencies, throughput and the
prompt tokens the server says it served from its prefix cache."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.bench.client import BenchConfig, BenchResult, run_benchmark
from radixkv.commands.inputs import (add_arrivals_args, add_workload_args, arrivals_from_args,
                                     arrivals_meta, concurrency_from_args, load_from_args)
from radixkv.commands.output import (Outputs, advance_by, check_file_target, console, metadata, pct,
                                     progress_bar, unit_of, workload_info)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench-serve", help="replay a workload against a running OpenAI-compatible server",
        description="Send a workload's prompts, as token ids, to POST /v1/completions of a "
                    "running server (radixkv serve, SGLang or vLLM) with streaming, ignore_eos "
                    "and max_tokens = the recorded output length, then print TTFT, ITL and E2E "
                    "percentiles, throughput and the cached prompt tokens the server reports "
                    "(usage.prompt_tokens_details.cached_tokens; 0 when it reports none). "
                    "Token ids must lie in the server's vocabulary: for a byte-level model "
                    "such as tiny-llama give --vocab-size 256. Exit status 1 when no request "
                    "completed.")
    p.add_argument("--base-url", required=True, metavar="URL",
                   help="the server, e.g. http://127.0.0.1:30000 (a trailing /v1 is allowed)")
    p.add_argument("--model", metavar="NAME",
                   help="the model name sent in each request (default: the first of GET "
                        "/v1/models)")
    p.add_argument("--api-key", metavar="KEY", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--text-prompts", action="store_true",
                   help="send each prompt as text (token t as the character chr(33 + t %% 94)), "
                        "for gateways and servers that take text only")
    add_workload_args(p)
    p.add_argument("--num-prompts", type=int, dest="limit", metavar="N",
                   help="send only the first N requests (the same as --limit)")
    p.add_argument("--seed", type=int, metavar="N", help="seed of a workload generator")
    mode = p.add_argument_group("load").add_mutually_exclusive_group()
    mode.add_argument("--request-rate", type=float, metavar="R",
                      help="open loop at a mean R requests/s: the trace's arrival times scaled "
                           "(requests that all arrive together: one every 1/R s); inf: all at "
                           "once; with --arrivals session, the first turns' times (default: "
                           "the arrival times as recorded)")
    mode.add_argument("--max-concurrency", type=int, metavar="N",
                      help="closed loop: N clients, each sending its next request when its "
                           "previous one finishes (a session stays on one client, in order)")
    add_arrivals_args(p)
    g = p.add_argument_group("bounds")
    g.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds one request may take before it counts as an error "
                        "(default: 600)")
    g.add_argument("--duration-limit", type=float, metavar="S",
                   help="stop the run after S seconds: requests in flight count as errors, the "
                        "rest are not sent (default: none)")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write the summary, with the run's metadata, as JSON")
    p.set_defaults(func=run)


def cell(key: str, v: Any, rate_unit: bool = True) -> str:
    """A figure as the tables show it, by its unit (a rate's unit left out when its column
    names it)."""
    if v is None:
        return "-"
    unit = unit_of(key)
    if unit == "fraction":
        return pct(v)
    if unit == "s":
        return f"{v * 1000:,.1f} ms" if v < 1 else f"{v:,.3f} s"
    if unit in ("tokens/s", "requests/s"):
        return f"{v:,.1f} {unit}" if rate_unit else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"


def summary_table(result: BenchResult, title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for k, v in result.summary.items():
        if k == "error_examples":
            for msg, n in v.items():
                table.add_row(f"error ×{n}", msg)
        else:
            table.add_row(k, cell(k, v))
    return table


def run(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_file_target(args.json, "--json")
    clients = concurrency_from_args(args)
    arrivals = arrivals_from_args(args, clients)
    cfg = BenchConfig(args.base_url, model=args.model, request_rate=args.request_rate,
                      max_concurrency=clients, timeout=args.timeout,
                      duration_limit=args.duration_limit, api_key=args.api_key,
                      text=args.text_prompts, arrivals=arrivals)
    wl = load_from_args(args, seed_for_traces=False)
    con = console()
    with progress_bar(con) as bar:
        result = run_benchmark(wl, cfg, progress=advance_by(bar, "requests", len(wl)))
    if clients is not None:
        mode = f"{clients} clients"
    elif args.request_rate is not None:
        mode = f"{args.request_rate:g} requests/s"
    else:
        mode = "arrival times"
    if arrivals is not None:
        mode = f"session arrivals, {arrivals.describe()}" + (
            "" if args.request_rate is None else f", first turns at {args.request_rate:g}/s")
    con.print(summary_table(result, f"{result.model} at {cfg.base_url} · {wl.name} "
                                    f"({len(wl)} requests) · {mode}"))
    if args.json is not None:
        row = {"name": result.model, **result.summary}
        doc = metadata(workload_info(wl, args.workload), model=result.model, gpu=None,
                       max_total_tokens=None, results=[row], max_concurrency=clients)
        doc.update(base_url=cfg.base_url, request_rate=finite_or_str(args.request_rate),
                   **arrivals_meta(arrivals))
        with Outputs() as out:
            out.write_json(args.json, doc)
        con.print(f"wrote {args.json}")
    return 1 if result.summary["completed"] == 0 else 0


def finite_or_str(x: float | None) -> float | str | None:
    """A rate for strict JSON: inf is written as the string "inf"."""
    return "inf" if x is not None and x == float("inf") else x
