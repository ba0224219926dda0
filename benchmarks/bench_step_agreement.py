"""Step agreement: radixkv's step prices beside aiconfigurator-core's measured-kernel estimates,
for Llama-3-8B (bf16, TP 1) on H100 and H200, vLLM and SGLang tables, in the same run.

The grid is the one `../shared/peers/aic_grid.py` prints: prefill steps of B segments of N new
tokens after P cached (B in 1, 4; N in 128 ... 8192; P in 0, 4096, 32768) and decode steps of B
requests of context C. The measured figure is aiconfigurator-core's own prediction for that step
(`predict_prefill_latency(B, P + N, prefix=P)`, `decode_step_latency(B, C, 2)`). Besides the
grid, an off-grid set (seeded: N, P and C between the table's grid points, B in 2 ... 96) checks
the interpolation where it does not sit on a tabulated point. Each row: median and worst
|radixkv / measured - 1| for radixkv's default timing (the measured tables) and for the roofline.
Goal: median <= 0.10 and worst <= 0.30, prefill and decode, both GPUs.

Last, simulation speed: the same workload simulated with the measured tables and with the
roofline, CPU seconds of the whole simulation, best of three (goal: measured <= 1.2x the
roofline's).

    python benchmarks/bench_step_agreement.py [--speed-requests 600]
"""
from __future__ import annotations

import argparse
import logging
import random
import statistics
import time

from rich.console import Console
from rich.table import Table

from radixkv.sim.measured import named_cost
from radixkv.sim.tables import AIC_MODELS, AIC_SYSTEMS, AIC_VERSIONS

MODEL = "llama-3-8b"
GPUS = ("h100-sxm", "h200")
PREFILL = [(b, n, p) for b in (1, 4) for n in (128, 512, 2048, 8192) for p in (0, 4096, 32768)]
DECODE = [(b, c) for b in (1, 8, 32, 128) for c in (1024, 4096, 16384)]
MEDIAN_GOAL, WORST_GOAL, SPEED_GOAL = 0.10, 0.30, 1.2


def off_grid(seed: int = 0) -> tuple[list, list]:
    rng = random.Random(seed)
    pre = [(rng.choice((1, 2, 3, 5, 8)), rng.randint(100, 6000), rng.choice((0, rng.randint(1, 60000))))
           for _ in range(24)]
    dec = [(rng.randint(2, 96), rng.randint(300, 30000)) for _ in range(12)]
    return pre, dec


def errors(cost, eng, prefill, decode) -> tuple[list[float], list[float]]:
    pe = [cost.step_time([(p, n)] * b, ()) * 1e3 / eng.predict_prefill_latency(b, p + n, prefix=p) - 1
          for b, n, p in prefill]
    de = [cost.step_time((), [c] * b) * 1e3 / eng.decode_step_latency(b, c, 2) - 1
          for b, c in decode]
    return pe, de


def cell(errs: list[float], ok: bool | None = None) -> str:
    med, worst = statistics.median(abs(e) for e in errs), max(abs(e) for e in errs)
    mark = "" if ok is None else (" ✓" if med <= MEDIAN_GOAL and worst <= WORST_GOAL else " ✗")
    return f"{med:.3f} / {worst:.3f}{mark}"


def agreement(con: Console) -> None:
    from aiconfigurator_core.sdk import EngineHandle
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    pre_off, dec_off = off_grid()
    t = Table(title="step agreement: median / worst |radixkv / measured - 1|, Llama-3-8B bf16 TP1")
    for col in ("GPU", "tables", "points", "prefill: measured timing", "decode: measured timing",
                "prefill: roofline", "decode: roofline"):
        t.add_column(col, justify="left" if col in ("GPU", "tables", "points") else "right")
    for gpu in GPUS:
        system = AIC_SYSTEMS[gpu]
        for backend in ("vllm", "sglang"):
            version = AIC_VERSIONS[backend][system]
            eng = EngineHandle.compile(AIC_MODELS[MODEL], system, backend,
                                       backend_version=version, tp_size=1)
            measured = named_cost(MODEL, gpu, timing=f"{backend}:{version}")
            roof = named_cost(MODEL, gpu, timing="roofline")
            for label, pre, dec in (("grid", PREFILL, DECODE), ("off-grid", pre_off, dec_off)):
                mp, md = errors(measured, eng, pre, dec)
                rp, rd = errors(roof, eng, pre, dec)
                t.add_row(gpu, f"{backend} {version}", f"{label} ({len(pre)}+{len(dec)})",
                          cell(mp, True), cell(md, True), cell(rp), cell(rd))
    con.print(t)


def speed(con: Console, requests: int) -> None:
    from radixkv.config import EngineConfig
    from radixkv.offline.simulate import run_config
    from radixkv.workloads.generators import make_workload
    wl = make_workload("support", seed=0, num_users=max(1, requests // 4))
    t = Table(title=f"simulation speed: support ({len(wl)} requests), radix cache, 100,000 tokens")
    for col in ("timing", "CPU s", "µs per request", "ratio"):
        t.add_column(col, justify="left" if col == "timing" else "right")
    base = None
    for timing in ("roofline", "vllm"):
        cost = named_cost(MODEL, "h100-sxm", timing=timing)
        cfg = EngineConfig(kv_capacity=100_000)
        best = None
        for _ in range(3):
            t0 = time.process_time()
            run_config(wl, cfg, cost)
            dt = time.process_time() - t0
            best = dt if best is None else min(best, dt)
        base = best if base is None else base
        ratio = best / base
        mark = "" if timing == "roofline" else (" ✓" if ratio <= SPEED_GOAL else " ✗")
        t.add_row(cost.timing, f"{best:.2f}", f"{best / len(wl) * 1e6:,.0f}", f"{ratio:.2f}{mark}")
    con.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed-requests", type=int, default=600)
    args = ap.parse_args()
    con = Console(width=160)
    agreement(con)
    speed(con, args.speed_requests)


if __name__ == "__main__":
    main()
