"""Disaggregated prefill/decode beside an independent simulator: `radixkv cluster
--prefill-replicas P --decode-replicas D` beside NVIDIA Dynamo's DynoSim in its disaggregated
mode (`aisimulate predict --stack dynamo`, `engine.mode: disaggregated`) on the same inputs,
Mooncake's synthetic trace on 4 prefill + 4 decode H100s serving Llama-3.1-8B (bf16) with vLLM,
round robin and Dynamo's KV router (and radixkv's own router, radixkv side only).

Same inputs as bench_dynosim.py: both read one copy of the trace without the 10 prompts longer
than the model's 131,072-token context; every worker runs vLLM's scheduler as DynoSim
configures it (blocks of 64 tokens, 8,192 batched tokens, 6,765 blocks = 432,960 tokens per
replica, vLLM 0.24.0 tables) with 256 running requests, the prefill workers included (DynoSim's
prefill default is 1, so its configs get `workers.prefill.scheduler: {max_sequences: 256}`):

    radixkv cluster TRACE --engine vllm --block-size 64 --max-running-requests 256
        --max-total-tokens 432960 --prefill-replicas 4 --decode-replicas 4 --kv-link rdma
        --router NAME

The KV link: radixkv's rdma link moves each transfer at 45 GB/s achieved plus 50 us of setup,
and one prefill worker's transfers queue behind each other on its link. DynoSim gets the same
rate, `engine.kv_transfer: {bandwidth_gb_per_second: 45, timing_mode: full_prompt}` (the
whole prompt moves, as in radixkv; DynoSim's default charges only the blocks missing on the
chosen decode worker), but has no per-transfer latency and no link queue (each transfer is its
own delay, bytes / rate). Both
count 131,072 KV bytes per token. In both the client's first token comes from the decode
worker (prefill, transfer, one decode step), ITL is the decode pool's, and the hit rate is the
prefill pool's. The decode worker is picked by load in both (radixkv: least-load; DynoSim:
round robin under round_robin, active blocks under kv_router).

Figures per router, radixkv / DynoSim: hit rate, TTFT p50 and p99, ITL p50 and p99, E2E p99,
output tokens/s, and each run's wall time (the whole CLI, start-up included, one process per
router on each side). A second table gives radixkv's per-pool figures.

    python benchmarks/bench_disagg.py [--split 4 4] [--link rdma] [--trace PATH]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from radixkv.sim.kv_links import KV_LINKS

from bench_dynosim import (BLOCK, BLOCKS, DYNOSIM, MAX_MODEL_LEN, ROOT, TRACE,  # noqa: E402
                           filtered_trace)

AISIM = ROOT / "benchmarks/aisim"
MAX_RUNNING = 256                   # vLLM's max_num_seqs, on prefill and decode workers alike
ROUTERS = {"round-robin": ("mooncake_synthetic_h100_disagg_4p4d_rr.yaml", "round-robin"),
           "KV router": ("mooncake_synthetic_h100_disagg_4p4d_kv.yaml", "dynamo-kv")}
EXTRA = ("radixkv",)              # radixkv's routers, on the radixkv side only
WORKER = ("    {role}:\n      kv_cache: {{prefix_caching: true}}\n"
          "      parallelism: {{replicas: {n}, tensor: 1}}\n")


def dynosim_config(config: str, split: tuple[int, int], gbps: float, trace: Path,
                   tmp: Path) -> Path:
    """The 4p4d config with the trace, the split, the link's rate and the prefill workers'
    256-request cap; each patch must find its text."""
    pre, dec = split
    text = (AISIM / config).read_text()
    patches = [
        ("../shared/traces/mooncake/synthetic_trace.jsonl", str(trace)),
        ("  mode: disaggregated\n",
         f"  mode: disaggregated\n  kv_transfer: {{bandwidth_gb_per_second: {gbps:g}, "
         f"timing_mode: full_prompt}}\n"),
        (WORKER.format(role="prefill", n=4), WORKER.format(role="prefill", n=pre)
         + f"      scheduler: {{max_sequences: {MAX_RUNNING}}}\n"),
        (WORKER.format(role="decode", n=4), WORKER.format(role="decode", n=dec)),
    ]
    for old, new in patches:
        if text.count(old) != 1:
            raise RuntimeError(f"{config}: expected one {old!r}")
        text = text.replace(old, new)
    cfg = tmp / f"{pre}p{dec}d-{config}"
    cfg.write_text(text)
    return cfg


def dynosim(config: str, split: tuple[int, int], gbps: float, trace: Path, tmp: Path) -> dict:
    cfg = dynosim_config(config, split, gbps, trace, tmp)
    out = tmp / f"out-{cfg.stem}"
    t0 = time.perf_counter()
    proc = subprocess.run([str(DYNOSIM), "predict", "--stack", "dynamo", "-c", str(cfg),
                           "--output-dir", str(out), "--overwrite"], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"DynoSim failed ({proc.returncode}): {proc.stderr[-400:]}")
    s = json.loads((out / "prediction.json").read_text())["summary"]
    return {"hit": s["prefix_cache_reused_ratio"], "p50": s["median_ttft_ms"] / 1e3,
            "p99": s["p99_ttft_ms"] / 1e3, "itl50": s["median_itl_ms"] / 1e3,
            "itl99": s["p99_itl_ms"] / 1e3, "e2e": s["p99_e2e_latency_ms"] / 1e3,
            "tput": s["output_throughput_tok_s"], "done": s["completed_requests"], "wall": wall}


def radixkv(router: str, split: tuple[int, int], link: str, trace: Path, tmp: Path,
            kept: int) -> dict:
    out = tmp / f"radixkv-{router}.json"
    cmd = [sys.executable, "-m", "radixkv", "cluster", str(trace), "--engine", "vllm",
           "--block-size", str(BLOCK), "--max-running-requests", str(MAX_RUNNING),
           "--max-total-tokens", str(BLOCKS * BLOCK), "--prefill-replicas", str(split[0]),
           "--decode-replicas", str(split[1]), "--kv-link", link, "--router", router,
           "--json", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"radixkv cluster failed: {proc.stderr[-400:]}")
    row = json.loads(out.read_text())["results"][0]
    d = row["details"]
    return {"hit": row["hit_rate"], "p50": row["ttft_p50"], "p99": row["ttft_p99"],
            "itl50": d["itl_p50"], "itl99": d["itl_p99"], "e2e": row["e2e_p99"],
            "tput": row["throughput_tok_s"], "done": kept, "wall": wall, "pools": d["pools"]}


CELLS = (("hit", "{:.3f}", 1), ("p50", "{:.3f} s", 1), ("p99", "{:.2f} s", 1),
         ("itl50", "{:.2f} ms", 1e3), ("itl99", "{:.2f} ms", 1e3), ("e2e", "{:.2f} s", 1),
         ("tput", "{:,.0f}", 1), ("wall", "{:.1f} s", 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", type=int, nargs=2, default=[4, 4], metavar=("PREFILL", "DECODE"))
    ap.add_argument("--link", default="rdma", choices=KV_LINKS.names())
    ap.add_argument("--trace", type=Path, default=TRACE)
    args = ap.parse_args()
    split = tuple(args.split)
    gbps = KV_LINKS.get(args.link).achieved_Bps / 1e9
    con = Console(width=190)
    for need in (args.trace, DYNOSIM):
        if not need.exists():
            con.print(f"skipped: {need} is absent (the trace: ../shared/traces; DynoSim: "
                      f"python benchmarks/peers.py dynosim)")
            return 0
    t = Table(title=f"disaggregated {split[0]} prefill + {split[1]} decode H100s, KV over "
                    f"{args.link} ({gbps:g} GB/s): Mooncake synthetic, Llama-3.1-8B, vLLM 0.24.0 "
                    "tables (radixkv / DynoSim)")
    for col in ("router", "requests", "hit rate", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
                "E2E p99", "output tok/s", "wall"):
        t.add_column(col, justify="left" if col == "router" else "right")
    p = Table(title="radixkv per pool (seconds)")
    for col in ("router", "prefill TTFT p99", "transfer p50", "transfer p99",
                "decode first token p99"):
        p.add_column(col, justify="left" if col == "router" else "right")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        trace = tmp / "mooncake_131k.jsonl"
        kept = filtered_trace(args.trace, trace)
        con.print(f"trace: {kept:,} requests of at most {MAX_MODEL_LEN:,} prompt tokens")
        rows = [(name, config, r) for name, (config, r) in ROUTERS.items()]
        rows += [(r, None, r) for r in EXTRA]
        for name, config, router in rows:
            ours = radixkv(router, split, args.link, trace, tmp, kept)
            theirs = dynosim(config, split, gbps, trace, tmp) if config else None
            cells = []
            for key, fmt, scale in CELLS:
                other = fmt.format(theirs[key] * scale) if theirs else "–"
                cells.append(f"{fmt.format(ours[key] * scale)} / {other}")
            label = f"{name} ({router})" if name != router else name
            done = f"{ours['done']:,} / {theirs['done']:,}" if theirs else f"{ours['done']:,} / –"
            t.add_row(label, done, *cells)
            pools = ours["pools"]
            p.add_row(router, f"{pools['prefill']['ttft_p99']:.3f}",
                      f"{pools['transfer']['seconds_p50']:.4f}",
                      f"{pools['transfer']['seconds_p99']:.4f}",
                      f"{pools['decode']['first_token_p99']:.4f}")
            con.print(f"{name} done")
    con.print(t)
    con.print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
