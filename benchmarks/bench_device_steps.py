"""The real engine's step times on a GPU beside vLLM's measured steps, shape for shape.

The grid is bench_step_agreement.py's (Llama-3-8B, bf16, TP 1): prefill steps of B segments of
N new tokens after P cached, and decode steps of B requests of context C. Each point is one
BatchPlan run through TorchExecutor.run (the engine's whole step: the attention plan built on
the host, the forward, sampling, a device sync), with random weights of the model's shape, for
each attention backend (`paged`: flex_attention over the pool; `sdpa`: padded gather). Cached
prefixes are real pool slots; a batch's segments share theirs, as requests sharing a cached
prefix do, so the largest decode point (128 x 16,384) fits beside the weights. Goal: within
1.5x of aiconfigurator-core's vLLM table for the same GPU and shape.

Two halves, because the tables and the GPU live on different machines:

    python benchmarks/bench_device_steps.py measure --out steps.json   # on the CUDA machine
    python benchmarks/bench_device_steps.py compare steps.json         # where aiconfigurator is
    python benchmarks/bench_device_steps.py measure --dry-run --out x.json   # tiny-llama, CPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from bench_step_agreement import DECODE, PREFILL  # noqa: E402  -- the grid, written once

BACKENDS = ("paged", "sdpa")
GOAL = 1.5


def log(msg: str) -> None:
    print(f"[device_steps {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- measure (needs torch; a CUDA device unless --dry-run) -------------------------------------
def plan_for(kind: str, shape: tuple, vocab: int, rng: np.random.Generator):
    """The BatchPlan of one grid point: prefill (B, N, P) or decode (B, C), shared prefix slots."""
    from radixkv.sched.batch import BatchPlan, Segment
    greedy = types.SimpleNamespace(rid="probe", sampling=None)
    if kind == "prefill":
        b, n, p = shape
        prefix = np.arange(p, dtype=np.int64)
        segs = [Segment(greedy, p, rng.integers(0, vocab, n).tolist(),
                        np.concatenate([prefix, p + i * n + np.arange(n)]), True) for i in range(b)]
        return BatchPlan(extends=segs)
    b, c = shape
    prefix = np.arange(c - 1, dtype=np.int64)
    segs = [Segment(greedy, c - 1, [int(rng.integers(0, vocab))], np.append(prefix, c - 1 + i), True)
            for i in range(b)]
    return BatchPlan(decodes=segs)


def slots_needed(prefill, decode) -> int:
    return max([p + b * n for b, n, p in prefill] + [c - 1 + b for b, c in decode])


def attention_plan(ex, plan):
    """The attention backend's per-forward plan of `plan`'s segments, as TorchExecutor.run
    builds it."""
    segs = plan.segments
    return ex.attention.plan([s.prefix_len for s in segs], [s.ctx_slots for s in segs], ex.device)


def time_point(ex, plan, reps: int, slow_s: float) -> dict:
    """Median of timed steps after one warm-up (compiles, allocator growth): `reps` of them, or
    one where a step takes longer than slow_s; and the host's share, the attention plan."""
    first = ex.run(plan).duration
    runs = [ex.run(plan).duration]
    if runs[0] <= slow_s:
        runs += [ex.run(plan).duration for _ in range(reps - 1)]
    t0 = time.perf_counter()
    attention_plan(ex, plan)
    host = time.perf_counter() - t0
    return {"ms": 1e3 * statistics.median(runs), "first_ms": 1e3 * first,
            "runs_ms": [round(1e3 * r, 3) for r in runs], "plan_ms": 1e3 * host}


def graph_ms(ex, plan, reps: int) -> float:
    """The same step's forward captured once as a CUDA graph and replayed: its kernels' time
    without the host's per-kernel launches (what an engine replaying graphs pays on the device)."""
    import torch
    batch = attention_plan(ex, plan)
    ids = torch.from_numpy(np.concatenate([np.asarray(s.input_ids) for s in plan.segments])
                           ).to(ex.device)
    fwd = lambda: ex.model(ids, batch.positions, ex.kv, batch)  # noqa: E731
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):          # warm-up off the default stream, as capture asks
            fwd(), fwd()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fwd()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del g
    torch.cuda.empty_cache()
    return statistics.median(times)


def measure(a: argparse.Namespace) -> int:
    import torch
    from radixkv.model.attention import attention_backend
    from radixkv.model.executor import TorchExecutor
    prefill, decode = PREFILL, DECODE
    if a.dry_run:
        a.model, a.device, a.dtype = "tiny-llama", "cpu", "float32"
        prefill = [(b, n // 64, p // 64) for b, n, p in PREFILL if n <= 512 and p <= 4096]
        decode = [(b, c // 64) for b, c in DECODE if b <= 8 and c <= 4096]
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        print(f"bench_device_steps: no CUDA device is available (torch {torch.__version__}); "
              f"run on a GPU machine, or use --dry-run", file=sys.stderr)
        return 2
    deadline = time.monotonic() + a.budget_s
    t0 = time.perf_counter()
    ex = TorchExecutor.from_config(a.model, slots_needed(prefill, decode), seed=0, device=a.device,
                                   dtype=getattr(torch, a.dtype))
    where = torch.cuda.get_device_name(ex.device) if ex.device.type == "cuda" else "CPU"
    log(f"{ex.name} on {where}: {ex.args.num_params / 1e6:,.0f}M params, KV pool "
        f"{ex.kv.num_slots:,} slots ({ex.kv.buf.nbytes / 2**30:.1f} GiB), built in "
        f"{time.perf_counter() - t0:.1f} s")
    out = {"model": a.model, "dtype": a.dtype, "device": where, "torch": torch.__version__,
           "reps": a.reps, "points": []}
    rng = np.random.default_rng(0)
    points = [("decode", s) for s in decode] + [("prefill", s) for s in prefill]
    for backend in BACKENDS:
        ex.attention = attention_backend(backend)
        for kind, shape in points:
            if time.monotonic() > deadline:
                log(f"budget of {a.budget_s} s spent: {backend} {kind} {shape} and later not run")
                break
            row = {"backend": backend, "kind": kind, "shape": list(shape)}
            plan = plan_for(kind, shape, ex.args.vocab_size, rng)
            try:
                row.update(time_point(ex, plan, a.reps, a.slow_s))
            except Exception as e:      # noqa: BLE001 -- an OOM or kernel limit is a result too
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                if ex.device.type == "cuda":
                    torch.cuda.empty_cache()
            if ex.device.type == "cuda" and row.get("ms", 1e9) <= a.graph_max_ms:
                try:
                    row["graph_ms"] = graph_ms(ex, plan, a.reps)
                except Exception as e:  # noqa: BLE001 -- a step that cannot be captured says why
                    row["graph_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    try:
                        torch.cuda.synchronize()
                        torch.cuda.empty_cache()
                    except Exception:   # noqa: BLE001 -- the row already says what failed
                        log("device not clean after a failed capture")
            out["points"].append(row)
            log(f"{backend} {kind} {shape}: " + (row.get("error") or
                f"{row['ms']:.2f} ms (first {row['first_ms']:.0f}, plan {row['plan_ms']:.2f}, graph "
                f"{row.get('graph_ms', row.get('graph_error', '-'))})"))
            a.out.write_text(json.dumps(out, indent=1))      # partial results survive a timeout
    if ex.device.type == "cuda":
        out["max_allocated_gib"] = torch.cuda.max_memory_allocated(ex.device) / 2**30
    a.out.write_text(json.dumps(out, indent=1))
    log(f"wrote {a.out}")
    return 0


# ---- compare (needs aiconfigurator-core) -------------------------------------------------------
def vllm_ms(eng, kind: str, shape: list[int]) -> float:
    if kind == "prefill":
        b, n, p = shape
        return float(eng.predict_prefill_latency(b, p + n, prefix=p))
    b, c = shape
    return float(eng.decode_step_latency(b, c, 2))


def compare(a: argparse.Namespace) -> int:
    import logging
    from aiconfigurator_core.sdk import EngineHandle
    from radixkv.sim.tables import AIC_MODELS, AIC_SYSTEMS, AIC_VERSIONS
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    data = json.loads(a.results.read_text())
    system = AIC_SYSTEMS[a.gpu]
    version = AIC_VERSIONS["vllm"][system]
    eng = EngineHandle.compile(AIC_MODELS[data["model"]], system, "vllm", backend_version=version,
                               tp_size=1)
    rows: dict[tuple, dict] = {}
    for pt in data["points"]:
        key = (pt["kind"], tuple(pt["shape"]))
        rows.setdefault(key, {})[pt["backend"]] = pt
    print(f"{data['model']} ({data['dtype']}) on {data['device']}, torch {data['torch']}; "
          f"vLLM {version} tables for {system}; ratio = radixkv step / vLLM step\n")
    print("| step | vLLM ms | " + " | ".join(f"{b} ms | {b} ratio | {b} graph ms | {b} graph ratio"
                                        for b in BACKENDS) + " |")
    print("|---|---:|" + "---:|---:|---:|---:|" * len(BACKENDS))
    ratios: dict[tuple[str, str], list[float]] = {}
    for (kind, shape), by in rows.items():
        ref = vllm_ms(eng, kind, list(shape))
        label = (f"prefill {shape[0]} x {shape[1]:,} after {shape[2]:,}" if kind == "prefill"
                 else f"decode {shape[0]} x {shape[1]:,}")
        cells = []
        for b in BACKENDS:
            pt = by.get(b)
            if pt is None or "error" in pt:
                cells.append(f"{'not run' if pt is None else pt['error'][:40]} | – | – | –")
                continue
            ratios.setdefault((kind, b), []).append(pt["ms"] / ref)
            cell = f"{pt['ms']:.1f} | {pt['ms'] / ref:.2f}"
            if "graph_ms" in pt:
                ratios.setdefault((kind, f"{b}, graph replay"), []).append(pt["graph_ms"] / ref)
                cell += f" | {pt['graph_ms']:.1f} | {pt['graph_ms'] / ref:.2f}"
            else:
                cell += f" | {pt.get('graph_error', 'not run')[:40]} | –"
            cells.append(cell)
        print(f"| {label} | {ref:.1f} | " + " | ".join(cells) + " |")
    print("\n| backend | kind | points | median ratio | worst ratio | within 1.5x |")
    print("|---|---|---:|---:|---:|---:|")
    for (kind, b), rs in sorted(ratios.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        print(f"| {b} | {kind} | {len(rs)} | {statistics.median(rs):.2f} | {max(rs):.2f} | "
              f"{sum(r <= GOAL for r in rs)} of {len(rs)} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time the grid on this machine's device, write JSON")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--model", default="llama-3-8b")
    m.add_argument("--device", default="cuda")
    m.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    m.add_argument("--reps", type=int, default=3, help="timed steps per point, after one warm-up")
    m.add_argument("--slow-s", type=float, default=5.0,
                   help="a point whose first timed step takes longer is reported from that step alone")
    m.add_argument("--budget-s", type=float, default=1e9,
                   help="stop starting new points after this many seconds (partial JSON kept)")
    m.add_argument("--graph-max-ms", type=float, default=400.0,
                   help="on CUDA, also replay as a CUDA graph each step faster than this")
    m.add_argument("--dry-run", action="store_true", help="tiny-llama on the CPU, a scaled grid")
    c = sub.add_parser("compare", help="the measured JSON beside aiconfigurator's vLLM table")
    c.add_argument("results", type=Path)
    c.add_argument("--gpu", default="h200")
    a = ap.parse_args(argv)
    return measure(a) if a.cmd == "measure" else compare(a)


if __name__ == "__main__":
    sys.exit(main())
