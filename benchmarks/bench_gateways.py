"""Gateways side by side, live: the same `radixkv serve --executor sim` workers (Llama-3-8B on an
H100, KV events on), the same bench-serve load, through

- radixkv route (`--router radixkv-fit`, the workers' KV events, the TTFT fitted online,
  the workers' tokenizer loaded locally), and the same priced by the named model's step cost
  alone (`--model`, no fit),
- radixkv route `--router round-robin` (the baseline),
- sglang-router `cache_aware`, vllm-router `kv_aware` (radixkv's events) and `cache_aware`
  (the peers, from `make interop`'s venvs; skipped, saying so, when absent),

on three workloads — support (a shared system prompt and few-shot block, sessions), fewshot
with four preambles competing for small pools, multi-turn sessions in closed loop — and prints
one table (prompts sent as text, every gateway routing on the same text): the cached share of
prompt tokens (from the replies' usage), TTFT p50 / p99, E2E p99, throughput, the gateway's own
CPU seconds over the run, requests per worker; then each gateway's added latency: the p50 of
sequential one-token requests through it minus the same sent to a worker directly. Between
runs every worker's cache is reset (`/reset_prefix_cache`) and the gateway restarted; the load
starts once the gateway has replayed the workers' KV event history (`settle`). With `--repeat
N` every workload goes through every gateway N times, in turn, and the table shows each
figure's median beside the TTFT p99 of every run: the p99 of a hundred-odd requests is about
the second-worst TTFT, and moves by a third between runs.

    python benchmarks/bench_gateways.py [--workers 4] [--requests 240] [--json OUT]
        [--gateways NAME ...] [--workloads NAME ...] [--latency-only] [--repeat N]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from radixkv.bench.client import BenchConfig, run_benchmark  # noqa: E402
from radixkv.bench.four_way import make_fewshot_workload  # noqa: E402
from radixkv.bench.process import ServerProcess  # noqa: E402
from radixkv.workloads import Workload, make_workload  # noqa: E402
from tests.interop.conftest import free_port, running  # noqa: E402
from tests.interop.peers import installed, program  # noqa: E402

MODEL = "llama-3-8b"


def workloads(n: int) -> dict[str, tuple[Workload, dict]]:
    """name -> (workload, send mode)."""
    sup = make_workload("support", num_users=max(n // 5, 4), turns=5, rate=4.0, seed=1)
    few = make_fewshot_workload("fewshot", MODEL, n, 12.0, 1, preambles=4)
    multi = make_workload("multiturn", num_users=max(n // 6, 4), turns=6, seed=1)
    cut = lambda w: Workload(w.name, w.requests[:n], w.skipped, w.block_size, w.meta)  # noqa: E731
    return {"support": (cut(sup), {}), "fewshot x4": (cut(few), {}),
            "multiturn closed": (cut(multi), {"max_concurrency": 16})}


def gateways(urls: list[str], events: dict[str, str], port: int, tokenizer: str
             ) -> dict[str, list[str] | None]:
    kv = [a for u in urls for a in ("--kv-events", f"{u}={events[u]}")]
    route = [sys.executable, "-m", "radixkv", "route", "--worker-urls", *urls, "--host",
             "127.0.0.1", "--port", str(port), "--tokenizer", tokenizer]
    out: dict[str, list[str] | None] = {
        "radixkv route": route + ["--router", "radixkv-fit", "--model", MODEL, *kv],
        "radixkv route, step cost only": route + ["--router", "radixkv", "--model", MODEL, *kv],
        "round-robin": route + ["--router", "round-robin"],
    }
    src = [a for u in urls for a in ("--kv-event-source", f"{u}={events[u].split(',')[0]}")]
    peer = {"sglang-router cache_aware": ("sglang-router", ["launch"], ["--policy", "cache_aware"]),
            "vllm-router kv_aware": ("vllm-router", [], ["--policy", "kv_aware",
                                                         "--kv-event-block-size", "1",
                                                         "--kv-event-model", MODEL, *src]),
            "vllm-router cache_aware": ("vllm-router", [], ["--policy", "cache_aware"])}
    for name, (tool, sub, args) in peer.items():
        out[name] = [str(program(tool)), *sub, "--host", "127.0.0.1", "--port", str(port),
                     "--prometheus-port", str(free_port()), "--worker-urls", *urls,
                     *args] if installed(tool) else None
    return out


def done(urls: list[str]) -> list[int]:
    """Requests each worker finished, over its series (vLLM keeps one per finish reason)."""
    out = []
    for u in urls:
        lines = httpx.get(f"{u}/metrics", timeout=10).text.splitlines()
        out.append(int(sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
                           if ln.startswith("vllm:request_success_total"))))
    return out


def added_latency(gateway: str, worker: str, n: int = 40, model: str = MODEL) -> float:
    """p50 of one-token requests through `gateway` minus directly to `worker` (the mean of the
    direct p50 before and after), in ms, after a warm-up of each (connections, first routes)."""
    def p50(url: str) -> float:
        times = []
        with httpx.Client(base_url=url, timeout=30) as c:
            for i in range(n):
                t0 = time.perf_counter()
                c.post("/v1/completions", json={"model": model, "prompt": f"hello {i}",
                                                "max_tokens": 1}).raise_for_status()
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3
    p50(gateway), p50(worker)
    before, via, after = p50(worker), p50(gateway), p50(worker)
    return via - (before + after) / 2


def settle(base: str, limit: float = 60.0) -> None:
    """Wait, at least a second, until a gateway that just answered /health has replayed every
    worker's buffered KV event history (radixkv route's `radixkv_route_kv_events_caught_up`; a
    peer: at once): its steady state is what is measured, not its start."""
    time.sleep(1.0)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        lines = [ln for ln in httpx.get(f"{base}/metrics", timeout=10).text.splitlines()
                 if ln.startswith("radixkv_route_kv_events_caught_up")]
        if all(ln.endswith(" 1.0") for ln in lines):
            return
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {base} did not catch up in {limit:g}s")


def worker_tokenizer(stack: contextlib.ExitStack) -> str:
    """The sim workers' tokenizer written to a directory `stack` removes: radixkv route loads it
    (--tokenizer), as the peers route on text without asking a worker."""
    tok = str(Path(stack.enter_context(tempfile.TemporaryDirectory())) / "tokenizer")
    subprocess.run([sys.executable, "-m", "radixkv", "tokenizer", tok, "--model", MODEL],
                   check=True, stdout=subprocess.DEVNULL)
    return tok


def session_cpu(sid: int) -> float:
    """CPU seconds (user + system) of the processes in session `sid` (a gateway started in a
    session of its own, with any process it started), and of the children they waited for."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:                                   # gone meanwhile
            continue
        if int(f[3]) == sid:
            total += sum(int(x) for x in f[11:15]) / tick
    return total


def reset_cache(url: str) -> None:
    """Empty the worker's prefix cache; vLLM serves /reset_prefix_cache only in dev mode."""
    r = httpx.post(f"{url}/reset_prefix_cache", timeout=30)
    if r.status_code == 404:
        raise SystemExit(f"{url}/reset_prefix_cache answered 404: a vLLM worker resets its "
                         f"cache only when started with VLLM_SERVER_DEV_MODE=1")
    r.raise_for_status()


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """(prefix-cache hit tokens, queried tokens) summed over the workers' own /metrics."""
    hits = queries = 0.0
    for u in urls:
        for line in httpx.get(f"{u}/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def measure(wl: Workload, mode: dict, gw_name: str, cmd: list[str], urls: list[str],
            latency: dict, model: str = MODEL) -> dict:
    """One run of `wl` through the gateway `cmd` (started afresh, every worker's cache reset):
    its figures; the gateway's added latency is measured on its first run only. The cached
    share is the clients' (their usage), `engine_cached_share` the workers' own counters'."""
    for u in urls:
        reset_cache(u)
    port = cmd[cmd.index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    before, counted = done(urls), prefix_counters(urls)
    with running(cmd, f"{base}/health", Path("/tmp") / f"gw-{port}.log") as proc:
        settle(base)                              # subscriptions in place, history replayed
        cpu0 = session_cpu(proc.pid)
        res = run_benchmark(wl, BenchConfig(base, model=model, timeout=300, text=True, **mode))
        cpu = session_cpu(proc.pid) - cpu0
        per_worker = [a - b for a, b in zip(done(urls), before)]
        hits, queries = (a - b for a, b in zip(prefix_counters(urls), counted))
        fit = httpx.get(f"{base}/workers").json().get("ttft_fit") \
            if gw_name.startswith("radixkv route") else None
        if gw_name not in latency:
            latency[gw_name] = added_latency(base, urls[0], model=model)
    s = res.summary
    return {"cached_share": s["cached_token_rate"],
            "engine_cached_share": hits / queries if queries else 0.0, "ttft_p50": s["ttft_p50"],
            "ttft_p99": s["ttft_p99"], "e2e_p99": s["e2e_p99"],
            "req_s": s["request_throughput_req_s"], "errors": s["errors"],
            "completed": f"{s['completed']}/{s['requests']}", "per_worker": per_worker,
            "gateway_cpu_s": cpu, "ttft_fit": fit}


FIGURES = ("cached_share", "ttft_p50", "ttft_p99", "e2e_p99", "req_s", "errors", "gateway_cpu_s")


def medians(rows: list[dict]) -> list[dict]:
    """One row per (workload, gateway), in first-seen order: the median of each figure over its
    runs, the requests per worker and the fit of its last run, and its TTFT p99 run by run."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["workload"], r["gateway"]), []).append(r)
    return [{**runs[-1], **{k: statistics.median(r[k] for r in runs) for k in FIGURES},
             "ttft_p99_runs": [r["ttft_p99"] for r in runs]} for runs in groups.values()]


def keep(name: str, only: list[str] | None) -> bool:
    """Whether `name` contains one of `only` (None: all); a NAME ending in "$" must be all of it."""
    return only is None or any(name == k[:-1] if k.endswith("$") else k in name for k in only)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--requests", type=int, default=240)
    ap.add_argument("--tokens", type=int, default=12_000, help="each worker's KV pool")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every workload through every gateway this many times, in turn; "
                         "the table shows each figure's median")
    ap.add_argument("--latency-only", action="store_true",
                    help="measure each gateway's added latency only (no workloads)")
    ap.add_argument("--gateways", nargs="+", metavar="NAME",
                    help="only the gateways whose names contain one of these (one ending in $: "
                         "whose name is it)")
    ap.add_argument("--workloads", nargs="+", metavar="NAME",
                    help="only the workloads whose names contain one of these")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat {args.repeat}: give 1 or more")
    con, rows, latency = Console(width=180), [], {}
    flags = ["--executor", "sim", "--model", MODEL, "--enable-metrics", "--max-total-tokens",
             str(args.tokens), "--kv-events-config", json.dumps({
                 "enable_kv_cache_events": True, "publisher": "zmq",
                 "endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"})]
    with contextlib.ExitStack() as st:
        tok = worker_tokenizer(st)
        procs = [st.enter_context(ServerProcess(flags)) for _ in range(args.workers)]
        urls = [p.base_url for p in procs]
        events = {}
        for u in urls:
            ev = httpx.get(f"{u}/server_info").json()["kv_events"]
            events[u] = f"{ev['endpoint']},{ev['replay_endpoint']}"
        if args.latency_only:
            for gw_name, cmd in gateways(urls, events, free_port(), tok).items():
                if cmd is not None and keep(gw_name, args.gateways):
                    port = cmd[cmd.index("--port") + 1]
                    with running(cmd, f"http://127.0.0.1:{port}/health",
                                 Path("/tmp") / f"gw-{port}.log"):
                        time.sleep(1.0)
                        latency[gw_name] = added_latency(f"http://127.0.0.1:{port}", urls[0])
        runs = [] if args.latency_only else range(args.repeat)
        for run in runs:                      # each repeat runs every gateway once more
            for wl_name, (wl, mode) in workloads(args.requests).items():
                for gw_name, cmd in gateways(urls, events, free_port(), tok).items():
                    if not (keep(wl_name, args.workloads) and keep(gw_name, args.gateways)):
                        continue
                    if cmd is None:
                        con.print(f"[yellow]{gw_name}: not installed (make interop): skipped")
                        continue
                    row = measure(wl, mode, gw_name, cmd, urls, latency)
                    rows.append({"workload": wl_name, "gateway": gw_name, "run": run, **row})
                    con.print(f"{wl_name} · {gw_name}, run {run + 1}: {row['completed']} done")
    table = Table(title="gateways side by side (sim Llama-3-8B / H100 workers)"
                        + (f", median of {args.repeat} runs" if args.repeat > 1 else ""))
    for col in ("workload", "gateway", "cached share", "TTFT p50", "TTFT p99", "E2E p99",
                "req/s", "errors", "gateway CPU", "requests per worker", "TTFT p99 by run"):
        table.add_column(col, justify="left" if col in ("workload", "gateway") else "right")
    summary = medians(rows)
    for r in summary:
        table.add_row(r["workload"], r["gateway"], f"{r['cached_share']:.1%}",
                      f"{r['ttft_p50']:.3f} s", f"{r['ttft_p99']:.3f} s", f"{r['e2e_p99']:.3f} s",
                      f"{r['req_s']:.2f}", str(r["errors"]), f"{r['gateway_cpu_s']:.1f} s",
                      " ".join(map(str, r["per_worker"])),
                      " ".join(f"{t:.3f}" for t in r["ttft_p99_runs"]))
    con.print(table)
    lat = Table(title="added latency, p50 of one-token requests, gateway − direct")
    lat.add_column("gateway")
    lat.add_column("ms", justify="right")
    for k, v in latency.items():
        lat.add_row(k, f"{v:.2f}")
    con.print(lat)
    fits = Table(title="radixkv route (radixkv-fit): the TTFT predicted at routing against the measured")
    for col in ("workload", "TTFTs seen", "median |pred/meas - 1|", "p90", "coefficients"):
        fits.add_column(col)
    for r in summary:
        if r.get("ttft_fit"):
            f = r["ttft_fit"]
            fits.add_row(r["workload"], str(f["observations"]), f"{f['median_abs_error']:.2f}",
                         f"{f['p90_abs_error']:.2f}",
                         " ".join(f"{k}={v:.3g}" for k, v in f["coefficients"].items()))
    con.print(fits)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "added_latency_ms": latency}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
