"""The profiled simulator against the real engine on every generated workload and on a
replayed trace: `radixkv validate`'s relative errors in one table.

One profile (`--profile`, else `radixkv calibrate --model M --device D` first: tiny-llama on
the CPU unless `--model` / `--device` say otherwise), then
one `radixkv validate` process per workload at its CPU-sized defaults, and the Mooncake
synthetic trace (skipped when absent) scaled to the CPU: its first `--trace-limit` requests
with every hash block standing for 512 / `--trace-scale` tokens (the same reuse structure, every
prompt that many times shorter), arrivals as recorded. `--cpu N` pins this process and every
command it runs to CPU N: calibrate and validate on one core, as a profile is only valid where
it was measured (on this 2-vCPU machine one vCPU runs the same step ~40 % slower than the other).

Each validate runs with --speed-check: the table has the errors of the simulation as
profiled and at the speed the machine ran the profile's grid steps around the real runs. Its
real figures are the median of --real-runs timed runs after an untimed pass (validate's
default unless given); the spread column is theirs, for the worst figure: how far the real
engine disagrees with itself there.

    .venv/bin/python benchmarks/bench_validate.py [--profile P] [--cpu 1] [--repeats 1]
        [--calibrate-each] [--real-runs N]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared/traces/mooncake/synthetic_trace.jsonl"
WORKLOADS = ("support", "fewshot", "multiturn", "burst", "tree", "rag")
METRICS = ("ttft_p50", "ttft_p90", "e2e_p50", "e2e_p90", "makespan_s", "busy_s")
TOLERANCE = 0.10


def radixkv(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "radixkv", *argv], check=True,
                   stdout=subprocess.DEVNULL)


def scaled_trace(src: Path, dst: Path, limit: int, scale: int) -> None:
    """The first `limit` lines of a 512-token-block hash-id trace, each block `scale` times
    shorter: input_length / scale rounded up keeps len(hash_ids) = ceil(input / block)."""
    with src.open() as f, dst.open("w") as out:
        for i, line in enumerate(f):
            if i == limit:
                break
            d = json.loads(line)
            d["input_length"] = -(-d["input_length"] // scale)
            out.write(json.dumps(d) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", type=Path, help="a profile of --model (default: calibrate)")
    ap.add_argument("--model", default="tiny-llama", help="named shape (default: tiny-llama)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    ap.add_argument("--attention", help="attention backend (default: the device's)")
    ap.add_argument("--trace", type=Path, default=MOONCAKE,
                    help="the hash-id trace replayed as `mooncake` (default: the shared copy)")
    ap.add_argument("--cpu", type=int, help="pin to this CPU (default: not pinned)")
    ap.add_argument("--repeats", type=int, default=1, help="validate runs per workload")
    ap.add_argument("--calibrate-each", action="store_true",
                    help="a fresh profile right before each workload's validate (a machine "
                         "whose speed drifts over minutes)")
    ap.add_argument("--no-speed-check", action="store_true",
                    help="validate without --speed-check (a dedicated device does not drift)")
    ap.add_argument("--real-runs", type=int,
                    help="timed real runs per validate, the median compared (default: validate's)")
    ap.add_argument("--trace-limit", type=int, default=150)
    ap.add_argument("--trace-scale", type=int, default=32)
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS) + ["mooncake"])
    args = ap.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})          # inherited by every command below
    tmp = Path(tempfile.mkdtemp(prefix="bench_validate_"))
    prof = args.profile

    def calibrate(name: str) -> Path:
        out = tmp / f"profile_{name}.json"
        radixkv("calibrate", "--model", args.model, "--device", args.device, "--out", str(out),
                *(["--attention", args.attention] if args.attention else []))
        held = json.loads(out.read_text()).get("correction") or {}
        print(f"profile {out}; held-out mixed batches: {held.get('held_out')}", flush=True)
        return out

    if prof is None and not args.calibrate_each:
        prof = calibrate("all")
    rows = []
    for w in args.workloads:
        target, extra = w, []
        if w == "mooncake":
            if not args.trace.is_file():
                print("mooncake: trace absent, skipped")
                continue
            target = str(tmp / f"mooncake_{args.trace_limit}_div{args.trace_scale}.jsonl")
            scaled_trace(args.trace, Path(target), args.trace_limit, args.trace_scale)
            extra = ["--trace-block-size", str(512 // args.trace_scale), "--vocab-size", "259"]
        for r in range(args.repeats):
            if args.calibrate_each:
                prof = calibrate(f"{w}_{r}")
            out = tmp / f"{w}_{r}.json"
            radixkv("validate", "--model", args.model, "--profile", str(prof), target, *extra,
                    *([] if args.no_speed_check else ["--speed-check"]),
                    *([] if args.real_runs is None else ["--real-runs", str(args.real_runs)]),
                    "--json", str(out))
            doc = json.loads(out.read_text())
            for key, label in (("metrics", "as profiled"), ("metrics_at_speed", "at the speed")):
                if key not in doc:
                    continue
                m = doc[key]
                errs = {k: m[k]["relative_error"] for k in METRICS}
                worst = max(METRICS[:-1], key=lambda k: abs(errs[k]))
                spread = doc["real_spread"]
                rows.append((w, label, doc["speed"]["simulated_at"] if key != "metrics" else 1.0,
                             errs, worst, m["busy_s"]["real"], spread[worst]))
                print(f"{w:10s} run {r} {label:12s}: " + "  ".join(
                    f"{k} {errs[k]:+.1%} (±{spread[k]:.0%})" for k in METRICS) +
                    f"  worst {worst} {errs[worst]:+.1%}", flush=True)
    print()
    print("| workload | simulated | speed | " + " | ".join(METRICS) +
          " | worst | its real spread | real busy s |")
    print("|---|---|---:|" + "---:|" * len(METRICS) + "---|---:|---:|")
    for w, label, sp, errs, worst, busy, spread in rows:
        print(f"| {w} | {label} | x{sp:.2f} | " + " | ".join(f"{errs[k]:+.1%}" for k in METRICS) +
              f" | {worst} {errs[worst]:+.1%} | {spread:.1%} | {busy:.2f} |")
    for label in ("as profiled", "at the speed"):
        mine = [x for x in rows if x[1] == label]
        within = sum(abs(x[3][x[4]]) <= TOLERANCE for x in mine)
        print(f"{label}: within {TOLERANCE:.0%} on every metric in {within} of {len(mine)} runs")
    if any(math.isinf(abs(x[3][x[4]])) for x in rows):
        print("an infinite error: a metric the real run measured as 0")


if __name__ == "__main__":
    main()
