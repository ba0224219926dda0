"""Agreement with an independent simulator: `radixkv cluster` beside NVIDIA Dynamo's DynoSim
(`aisimulate predict --stack dynamo`) on the same inputs, Mooncake's synthetic trace on 1, 4
and 8 H100 replicas serving Llama-3.1-8B (bf16) with vLLM, round robin and Dynamo's KV router.

Same inputs: both read one copy of the trace without the 10 prompts longer than the model's
131,072-token context (DynoSim rejects them at admission; radixkv would serve them). Both run
vLLM's scheduler as DynoSim configures it: blocks of 64 tokens, 8,192 batched tokens, 256
running requests, chunked prefill with decodes first in one token budget, LRU eviction, 6,765
blocks (432,960 tokens) per replica, timing from aiconfigurator-core's vLLM 0.24.0 tables:

    radixkv cluster TRACE --engine vllm --block-size 64 --max-running-requests 256
        --max-total-tokens 432960 --replicas N --router round-robin dynamo-kv

Figures: hit rate (DynoSim: its prefix-cache reuse ratio), TTFT p50 and p99, output tokens/s.
Goal: hit rate within 0.02, TTFT p50 within 30 %, p99 within 50 %, throughput within 5 %.
A second table sets radixkv's own router beside `dynamo-kv` (and round robin) on the same
simulated clusters.

    python benchmarks/bench_dynosim.py [--replicas 8 4 1] [--trace PATH]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared/traces/mooncake/synthetic_trace.jsonl"
AISIM = ROOT.parent / "shared/peers/aisim"
DYNOSIM = ROOT / ".peers/dynosim/bin/aisimulate"
MAX_MODEL_LEN = 131_072
BLOCKS, BLOCK = 6765, 64            # DynoSim's vLLM pool per replica: num_gpu_blocks x block
ROUTERS = {"round-robin": ("mooncake_synthetic_h100x8_rr.yaml", "round-robin"),
           "KV router": ("mooncake_synthetic_h100x8_kv.yaml", "dynamo-kv")}
GOALS = {"hit": 0.02, "p50": 0.30, "p99": 0.50, "tput": 0.05}
EXTRA = ("radixkv",)              # radixkv's routers, on the radixkv side only


def filtered_trace(src: Path, dst: Path) -> int:
    kept = 0
    with src.open() as f, dst.open("w") as g:
        for line in f:
            if json.loads(line)["input_length"] <= MAX_MODEL_LEN:
                g.write(line)
                kept += 1
    return kept


def dynosim(config: str, replicas: int, trace: Path, tmp: Path) -> dict:
    text = (AISIM / config).read_text()
    text = text.replace("../shared/traces/mooncake/synthetic_trace.jsonl", str(trace))
    text = text.replace("replicas: 8", f"replicas: {replicas}")
    cfg = tmp / f"{replicas}-{config}"
    cfg.write_text(text)
    out = tmp / f"out-{replicas}-{config}"
    proc = subprocess.run([str(DYNOSIM), "predict", "--stack", "dynamo", "-c", str(cfg),
                           "--output-dir", str(out), "--overwrite"], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"DynoSim failed ({proc.returncode}): {proc.stderr[-400:]}")
    s = json.loads((out / "prediction.json").read_text())["summary"]
    return {"hit": s["prefix_cache_reused_ratio"], "p50": s["median_ttft_ms"] / 1e3,
            "p99": s["p99_ttft_ms"] / 1e3, "tput": s["output_throughput_tok_s"],
            "done": s["completed_requests"]}


def radixkv(replicas: int, trace: Path, tmp: Path, kept: int) -> dict[str, dict]:
    out = tmp / f"radixkv-{replicas}.json"
    cmd = [sys.executable, "-m", "radixkv", "cluster", str(trace), "--engine", "vllm",
           "--block-size", str(BLOCK), "--max-running-requests", "256",
           "--max-total-tokens", str(BLOCKS * BLOCK), "--replicas", str(replicas),
           "--router", *[r for _, r in ROUTERS.values()], *EXTRA, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"radixkv cluster failed: {proc.stderr[-400:]}")
    rows = {r["router"]: r for r in json.loads(out.read_text())["results"]}
    return {name: {"hit": rows[r]["hit_rate"], "p50": rows[r]["ttft_p50"],
                   "p99": rows[r]["ttft_p99"], "tput": rows[r]["throughput_tok_s"],
                   "e2e": rows[r]["e2e_p99"], "done": kept}
            for name, r in [*((n, r) for n, (_, r) in ROUTERS.items()), *((r, r) for r in EXTRA)]}


def verdict(key: str, ours: float, theirs: float) -> tuple[str, bool]:
    if key == "hit":
        d = ours - theirs
        return f"{d:+.3f}", abs(d) <= GOALS[key]
    d = ours / theirs - 1
    return f"{100 * d:+.0f}%", abs(d) <= GOALS[key]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, nargs="+", default=[8, 4, 1])
    ap.add_argument("--trace", type=Path, default=TRACE)
    args = ap.parse_args()
    con = Console(width=170)
    for need in (args.trace, DYNOSIM):
        if not need.exists():
            con.print(f"skipped: {need} is absent (the trace: ../shared/traces; DynoSim: "
                      f"python benchmarks/peers.py dynosim)")
            return 0
    t = Table(title="radixkv cluster beside DynoSim: Mooncake synthetic, Llama-3.1-8B on H100, "
                    "vLLM 0.24.0 tables (radixkv / DynoSim, difference)")
    for col in ("replicas", "router", "requests", "hit rate", "TTFT p50", "TTFT p99",
                "output tok/s", "all four"):
        t.add_column(col, justify="left" if col == "router" else "right")
    r = Table(title="routers on the same simulated clusters (radixkv cluster)")
    for col in ("replicas", "router", "hit rate", "TTFT p50", "TTFT p99", "e2e p99",
                "output tok/s"):
        r.add_column(col, justify="left" if col == "router" else "right")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        trace = tmp / "mooncake_131k.jsonl"
        kept = filtered_trace(args.trace, trace)
        con.print(f"trace: {kept:,} requests of at most {MAX_MODEL_LEN:,} prompt tokens")
        for n in args.replicas:
            ours = radixkv(n, trace, tmp, kept)
            for name, (config, _) in ROUTERS.items():
                theirs = dynosim(config, n, trace, tmp)
                cells, ok = [], True
                for key, fmt in (("hit", "{:.3f}"), ("p50", "{:.3f} s"), ("p99", "{:.2f} s"),
                                 ("tput", "{:,.0f}")):
                    diff, good = verdict(key, ours[name][key], theirs[key])
                    ok &= good
                    cells.append(f"{fmt.format(ours[name][key])} / {fmt.format(theirs[key])} "
                                 f"({diff}){'' if good else ' ✗'}")
                t.add_row(str(n), name, f"{ours[name]['done']:,} / {theirs['done']:,}", *cells,
                          "✓" if ok else "✗")
            for name in ("round-robin", "KV router", *EXTRA):
                o = ours[name]
                r.add_row(str(n), "dynamo-kv" if name == "KV router" else name, f"{o['hit']:.3f}",
                          f"{o['p50']:.3f} s", f"{o['p99']:.2f} s", f"{o['e2e']:.2f} s",
                          f"{o['tput']:,.0f}")
            con.print(f"{n} replicas done")
    con.print(t)
    con.print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
