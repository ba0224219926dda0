"""Gateways in front of real vLLM workers: two vLLM CPU 0.32 workers of the tiny checkpoint (one
core each, a 16,384-token pool each, KV events on; `make real-engine` installs them), the same
closed-loop bench-serve load (prompts as text, 8 at a time), through

- radixkv route `--router radixkv-fit` with the workers' KV events (looked up by vLLM's own
  block hashes), and the same without events (its own index of what it sent),
- radixkv route `--router round-robin` (the baseline),
- sglang-router `cache_aware`, vllm-router `cache_aware` and `kv_aware` (vLLM's events; the
  peers from `make interop`'s venvs, skipped, saying so, when absent),

on the fewshot workload with eight preambles competing for the pools and on multi-turn
sessions (34 users, 6 turns). The cached share is the engines' own (`vllm:prefix_cache_hits` /
`..._queries`) beside the clients' (`cached_tokens`); then TTFT p50 / p99, E2E p99, errors and
requests per worker. Every worker's cache is reset between runs (vLLM's dev mode) and the
gateway restarted; `--repeat N` runs every gateway N times, interleaved, and the table shows
medians and each run's cached share and TTFT p99.

    python benchmarks/bench_gateways_vllm.py [--requests 200] [--repeat 3] [--json OUT]
        [--gateways NAME ...] [--workloads NAME ...]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_gateways import keep, measure, medians  # noqa: E402
from radixkv.bench.four_way import make_fewshot_workload  # noqa: E402
from radixkv.workloads import Workload, make_workload  # noqa: E402
from tests.interop.conftest import free_port  # noqa: E402
from tests.interop.peers import installed, program  # noqa: E402
from tests.realengine.workers import MODEL as CHECKPOINT, SERVED_NAME, VllmWorkers, \
    skip_reason  # noqa: E402

CONCURRENCY = 8


def workloads(n: int) -> dict[str, tuple[Workload, dict]]:
    """name -> (workload, send mode), token ids as the tiny model's (sent as text)."""
    few = make_fewshot_workload("fewshot", "tiny-llama", n, 12.0, 1, preambles=8)
    multi = make_workload("multiturn", num_users=34, turns=6, seed=1)
    cut = lambda w: Workload(w.name, w.requests[:n], w.skipped, w.block_size, w.meta)  # noqa: E731
    closed = {"max_concurrency": CONCURRENCY}
    return {"fewshot x8": (cut(few), closed), "multiturn 34 users": (cut(multi), closed)}


def gateways(ws, port: int) -> dict[str, list[str] | None]:
    urls = [w.url for w in ws]
    kv = [a for w in ws for a in ("--kv-events", f"{w.url}={w.events},{w.replay}")]
    route = [sys.executable, "-m", "radixkv", "route", "--worker-urls", *urls, "--host",
             "127.0.0.1", "--port", str(port), "--tokenizer", str(CHECKPOINT)]
    out: dict[str, list[str] | None] = {
        "radixkv route, events": route + ["--router", "radixkv-fit", *kv],
        "radixkv route, no events": route + ["--router", "radixkv-fit"],
        "round-robin": route + ["--router", "round-robin"],
    }
    src = [a for w in ws for a in ("--kv-event-source", f"{w.url}={w.events}")]
    peer = {"sglang-router cache_aware": ("sglang-router", ["launch"], ["--policy", "cache_aware"]),
            "vllm-router cache_aware": ("vllm-router", [], ["--policy", "cache_aware"]),
            "vllm-router kv_aware": ("vllm-router", [], ["--policy", "kv_aware",
                                                         "--kv-event-block-size", "32",
                                                         "--kv-event-model", SERVED_NAME, *src])}
    for name, (tool, sub, args) in peer.items():
        out[name] = [str(program(tool)), *sub, "--host", "127.0.0.1", "--port", str(port),
                     "--prometheus-port", str(free_port()), "--worker-urls", *urls,
                     *args] if installed(tool) else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=16_384, help="each worker's KV pool")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--gateways", nargs="+", metavar="NAME")
    ap.add_argument("--workloads", nargs="+", metavar="NAME")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 or more")
    reason = skip_reason()
    if reason:
        print(f"bench_gateways_vllm: {reason}", file=sys.stderr)
        return 2
    con, rows, latency = Console(width=200), [], {}
    # events on tcp: vllm-router's kv_aware subscribes to tcp://HOST:PORT only
    with VllmWorkers(2, kv_tokens=args.tokens, dev_mode=True, events_tcp=True) as ws:
        urls = [w.url for w in ws]
        for run in range(args.repeat):        # each repeat runs every gateway once more
            for wl_name, (wl, mode) in workloads(args.requests).items():
                for gw_name, cmd in gateways(ws, free_port()).items():
                    if not (keep(wl_name, args.workloads) and keep(gw_name, args.gateways)):
                        continue
                    if cmd is None:
                        con.print(f"[yellow]{gw_name}: not installed (make interop): skipped")
                        continue
                    row = measure(wl, mode, gw_name, cmd, urls, latency, model=SERVED_NAME)
                    rows.append({"workload": wl_name, "gateway": gw_name, "run": run, **row})
                    con.print(f"{wl_name} · {gw_name}, run {run + 1}: {row['completed']} done, "
                              f"cached {row['engine_cached_share']:.1%}")
    summary = medians(rows)
    table = Table(title=f"gateways in front of two vLLM CPU workers (tiny Llama, "
                        f"{args.tokens:,}-token pools, {CONCURRENCY} at a time), median of "
                        f"{args.repeat} runs")
    for col in ("workload", "gateway", "cached (vLLM)", "by run", "cached (clients)",
                "TTFT p50", "TTFT p99", "by run", "E2E p99", "errors", "per worker"):
        table.add_column(col, justify="left" if col in ("workload", "gateway") else "right")
    for r in summary:
        runs = [x for x in rows if (x["workload"], x["gateway"]) == (r["workload"], r["gateway"])]
        table.add_row(r["workload"], r["gateway"],
                      f"{statistics.median(x['engine_cached_share'] for x in runs):.1%}",
                      " ".join(f"{x['engine_cached_share']:.1%}" for x in runs),
                      f"{r['cached_share']:.1%}", f"{r['ttft_p50']:.3f} s",
                      f"{r['ttft_p99']:.3f} s", " ".join(f"{t:.2f}" for t in r["ttft_p99_runs"]),
                      f"{r['e2e_p99']:.2f} s", str(r["errors"]),
                      " ".join(map(str, r["per_worker"])))
    con.print(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "added_latency_ms": latency}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
