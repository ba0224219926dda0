"""The real engine on this CPU with its C heap kept (radixkv.model.host_heap, the default)
against glibc's defaults (RADIXKV_CPU_HEAP=release), in the same run.

Each workload (validate's CPU-sized defaults) runs in a fresh process per setting, the two
settings alternating over --rounds: an untimed pass, then --runs timed ones through the engine
on tiny-llama (TorchExecutor, one thread). Per setting: the median of the timed runs' busy
seconds (the executor's step time), and the process's kernel CPU seconds and minor page faults
over all its passes, the untimed one included. The ratio is kept / released: under 1, the kept heap is faster.

    .venv/bin/python benchmarks/bench_cpu_heap.py [--cpu 1] [--rounds 2] [--runs 3]
        [--workloads burst support fewshot tree]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SETTINGS = ("release", "keep")


def child(workload: str, runs: int) -> None:
    """One setting (from the environment), one workload: print its figures as JSON."""
    from radixkv.offline.calibration.fidelity import run_real_runs
    from radixkv.commands.validate import CPU_DEFAULTS, DEFAULT_TOKENS
    from radixkv.config import CacheConfig, EngineConfig
    from radixkv.model.host_heap import keep_heap
    from radixkv.model.setup import torch_target
    from radixkv.workloads.generators import make_workload

    target = torch_target("tiny-llama", "cpu", None, 1)
    cfg = EngineConfig(kv_capacity=DEFAULT_TOKENS, cache=CacheConfig("radix"))
    ex = target.executor(cfg.kv_capacity, seed=0, attention="sdpa")
    wl = make_workload(workload, **CPU_DEFAULTS.get(workload, {}),
                       vocab_size=target.args.vocab_size)
    before = resource.getrusage(resource.RUSAGE_SELF)
    rr = run_real_runs(wl, cfg, ex, runs)
    after = resource.getrusage(resource.RUSAGE_SELF)
    busy = [r["busy_s"] for r in rr.runs]
    print(json.dumps({"kept": keep_heap(), "busy_s": statistics.median(busy), "runs": busy,
                      "cold_busy_s": rr.cold["busy_s"],
                      "sys_s": after.ru_stime - before.ru_stime,
                      "minor_faults": after.ru_minflt - before.ru_minflt}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", type=int, help="pin to this CPU (default: not pinned)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two settings")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per process")
    ap.add_argument("--workloads", nargs="*", default=["burst", "support", "fewshot", "tree"])
    ap.add_argument("--child", nargs=2, metavar=("WORKLOAD", "RUNS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    got: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for w in args.workloads:
            for s in SETTINGS if r % 2 == 0 else SETTINGS[::-1]:
                env = {**os.environ, "RADIXKV_CPU_HEAP": s}
                out = subprocess.run([sys.executable, __file__, "--child", w, str(args.runs)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                doc = json.loads(out.strip().splitlines()[-1])
                assert doc["kept"] == (s == "keep"), doc
                got.setdefault((w, s), []).append(doc)
                print(f"{w:8s} round {r} {s:7s}: busy {doc['busy_s']:.3f} s (cold "
                      f"{doc['cold_busy_s']:.3f}), kernel {doc['sys_s']:.2f} s, "
                      f"{doc['minor_faults']:,} faults", flush=True)
    print()
    print("| workload | released busy s | kept busy s | kept / released | released kernel s "
          "| kept kernel s | released faults | kept faults |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for w in args.workloads:
        rel, kep = got[(w, "release")], got[(w, "keep")]
        med = lambda docs, k: statistics.median(d[k] for d in docs)  # noqa: E731
        print(f"| {w} | {med(rel, 'busy_s'):.3f} | {med(kep, 'busy_s'):.3f} | "
              f"{med(kep, 'busy_s') / med(rel, 'busy_s'):.2f} | {med(rel, 'sys_s'):.2f} | "
              f"{med(kep, 'sys_s'):.2f} | {med(rel, 'minor_faults'):,.0f} | "
              f"{med(kep, 'minor_faults'):,.0f} |")


if __name__ == "__main__":
    main()
