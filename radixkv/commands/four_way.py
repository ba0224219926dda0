"""`radixkv four-way`: one shared-prefix workload served by four `radixkv serve` configurations
(default, lpm-slru, page16, no-cache) over HTTP; what each client saw (latency, throughput,
cached tokens in usage) beside what each server counted (/metrics: prefix-cache queries and
hits, evicted tokens, retractions), as a table, four_way.json and four_way.png."""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.bench_serve import BenchConfig, BenchResult, run_benchmark
from radixkv.commands.bench_serve import cell, finite_or_str
from radixkv.commands.output import (Outputs, advance_by, check_dir_target, console, metadata,
                                     pct, progress_bar, workload_info)
from radixkv.serve_process import ServerProcess, scrape_metrics
from radixkv.shapes import MODEL_CONFIGS
from radixkv.sim.specs import GPU_SPECS
from radixkv.validate import positive_int
from radixkv.workloads import GENERATORS, Workload, make_workload

CONFIGS: dict[str, list[str]] = {
    "default": [],
    "lpm-slru": ["--schedule-policy", "lpm", "--radix-eviction-policy", "slru"],
    "page16": ["--page-size", "16"],
    "no-cache": ["--disable-radix-cache"],
}
DEFAULT_MODEL = {"torch": "tiny-llama", "sim": "llama-3-8b"}
# few-shot sizes: a byte-level model on a CPU serves the small one in seconds per server; the
# large one is a realistic few-shot load (a 4k-token preamble, 200 questions)
FEWSHOT = {
    "small": dict(num_questions=64, preamble_len=1024, question_len=(16, 64),
                  output_len=(16, 64), vocab_size=256),
    "large": dict(num_questions=200, preamble_len=4000, question_len=(20, 200),
                  output_len=(50, 200), vocab_size=32000),
}
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
EVICTED, RETRACTIONS = "radixkv_evicted_tokens_total", "radixkv_retractions_total"


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


def make_fewshot_workload(name: str, model: str, num_prompts: int | None, rate: float,
                          seed: int, preambles: int = 1) -> Workload:
    """The workload every configuration gets; token ids within the model's vocabulary. With
    `preambles` > 1 (fewshot only), that many few-shot workloads (seeds seed, seed+1, ...: each
    its own preamble) share the questions and are interleaved in a seeded random order."""
    positive_int(preambles, "--preambles")
    vocab = _vocab(model)
    size = FEWSHOT["small" if vocab < 1000 else "large"]
    if preambles > 1:
        if name != "fewshot":
            raise ValueError(f"--preambles applies to the fewshot workload, not {name!r}")
        total = num_prompts or size["num_questions"]
        if total < preambles:
            raise ValueError(f"--num-prompts {total} is fewer than --preambles {preambles}")
        parts = [make_fewshot_workload(name, model, total // preambles + (k < total % preambles),
                                       math.inf, seed + k) for k in range(preambles)]
        reqs = [dataclasses.replace(r, id=f"pre{k}-{r.id}") for k, w in enumerate(parts)
                for r in w.requests]
        random.Random(seed).shuffle(reqs)
        gap = 0.0 if math.isinf(rate) else 1.0 / rate
        reqs = [dataclasses.replace(r, arrival=i * gap) for i, r in enumerate(reqs)]
        return Workload(f"fewshot x{preambles} preambles", reqs,
                        meta={**parts[0].meta, "preambles": preambles, "num_questions": total})
    kw: dict[str, Any] = {"seed": seed, "vocab_size": min(size["vocab_size"], vocab),
                          "rate": None if math.isinf(rate) else rate}
    if name == "fewshot":
        kw.update({k: v for k, v in size.items() if k != "vocab_size"})
        if num_prompts is not None:
            kw["num_questions"] = num_prompts
    w = make_workload(name, **kw)
    if num_prompts is not None and len(w) > num_prompts:
        w = Workload(w.name, w.requests[:num_prompts], w.skipped, w.block_size, w.meta)
    return w


def _vocab(model: str) -> int:
    return MODEL_CONFIGS[model].vocab_size if model in MODEL_CONFIGS else 32000


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> int | None:
    if key not in after:
        return None
    return round(after[key] - before.get(key, 0.0))


def make_row(name: str, result: BenchResult, before: dict[str, float],
             after: dict[str, float]) -> dict:
    """One configuration's figures: the client's summary and the server's counters over the
    run (after - before)."""
    s = result.summary
    queries, hits = _delta(before, after, QUERIES), _delta(before, after, HITS)
    return {
        "name": name, "flags": " ".join(CONFIGS[name]),
        "requests": s["requests"], "completed": s["completed"], "errors": s["errors"],
        "prompt_tokens": s["prompt_tokens"], "cached_tokens": s["cached_tokens"],
        "hit_rate": hits / queries if queries and hits is not None else None,
        "queried_tokens": queries, "hit_tokens": hits,
        "prefill_tokens": None if queries is None or hits is None else queries - hits,
        "evicted_tokens": _delta(before, after, EVICTED),
        "retractions": _delta(before, after, RETRACTIONS),
        "ttft_p50": s["ttft_p50"], "ttft_p99": s["ttft_p99"], "e2e_p99": s["e2e_p99"],
        "output_tok_s": s["output_tok_s"], "details": s,
    }


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


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Bars of the hit rate (from the counters) and the TTFT p99 per configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label, scale in ((axes[0], "hit_rate", "prefix-cache hit rate (%)", 100),
                                  (axes[1], "ttft_p99", "TTFT p99 (s)", 1)):
        values = [0.0 if r[key] is None else r[key] * scale for r in rows]
        bars = ax.bar(names, values, color=["#4c72b0", "#55a868", "#c44e52", "#8c8c8c"])
        ax.bar_label(bars, labels=["-" if r[key] is None else f"{r[key] * scale:.3g}"
                                   for r in rows])
        ax.margins(y=0.12)                  # room for the labels above the bars
        ax.set_ylabel(label)
        ax.set_title(label)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
