"""One prepared check for a CUDA machine (about 2-3 minutes on an H200).

1. Cache correctness on the device: tiny-llama in fp32 with the batch-invariant executor,
   prompts sharing long prefixes and diverging mid-edge, radix (page 1, and page 16 with
   chunked prefill) vs no cache: greedy outputs and final logits must be exactly equal.
2. Timing: a random model of llama-3-8b's shape in bf16 on the support workload (20 users x
   3 turns, 16-32 forced reply tokens, 12 RAG requests), radix vs no cache: prefill tokens,
   wall time, TTFT p50, tokens/s and the speed-up, as a markdown table (--out FILE or stdout).

3. Simulator fidelity: calibrate the same model (radixkv.offline.calibration.measure, the CUDA grid), then run
   the support workload on the real engine and on the profiled simulator: TTFT p50/p90, E2E
   p50/p90, makespan and each relative error (the `radixkv validate` table).
4. Attention backends: the timing of 2. with the paged (flex_attention) backend and with the
   reference sdpa backend (padded gather), radix vs no cache.

    python benchmarks/gpu_check.py --out results.md
    python benchmarks/gpu_check.py --dry-run          # tiny-llama on the CPU, small workload
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixkv.commands.generate import CPU_DEFAULTS  # noqa: E402
from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig  # noqa: E402
from radixkv.engine.engine import Engine, request_from_trace  # noqa: E402
from radixkv.model.executor import TorchExecutor  # noqa: E402
from radixkv.model.model import Transformer  # noqa: E402
from radixkv.shapes import get_model_config  # noqa: E402
from radixkv.model.sampling import SamplingParams  # noqa: E402
from radixkv.sched.request import Request  # noqa: E402
from radixkv.workloads import make_workload  # noqa: E402


def log(msg: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def waves(vocab: int, scale: float = 1.0) -> list[list[tuple[str, list[int]]]]:
    """Three waves of prompts sharing prefixes; later ones diverge in the middle of edges."""
    rng = np.random.default_rng(7)
    t = lambda n: rng.integers(0, vocab, int(n * scale)).tolist()  # noqa: E731
    S, a = t(300), t(200)
    cut = lambda x, n: x[:int(n * scale)]  # noqa: E731
    return [[("A", S + a), ("B", S + t(150))],
            [("C", cut(S + a, 390) + t(80)), ("D", cut(S, 211) + t(120)), ("E", S + a + t(50))],
            [("F", cut(S + a, 390) + t(70)), ("G", cut(S, 77) + t(40))]]


def run_waves(state: dict, device: str, kind: str, page: int = 1, chunk: int = 0, new: int = 8,
              scale: float = 1.0):
    """Greedy, unforced, batch-invariant fp32 run: (outputs, final logits, report)."""
    args = get_model_config("tiny-llama")
    model = Transformer(args)
    model.load_state_dict(state)
    cfg = EngineConfig(kv_capacity=8192, cache=CacheConfig(kind, page),
                       sched=SchedulerConfig(chunked_prefill_size=chunk), check_invariants=True)
    ex = TorchExecutor(model, args, cfg.kv_capacity, device=device, dtype=torch.float32,
                       batch_invariant=True)
    ex.keep_logits = True
    eng = Engine(cfg, cfg.cache.build(), ex)
    for wave in waves(args.vocab_size, scale):
        for rid, prompt in wave:
            eng.add_request(Request(rid, prompt, new, arrival=eng.now, sampling=SamplingParams()))
        rep = eng.run_until_idle()
    eng.manager.check()
    return {r.rid: list(r.output) for r in eng.finished}, dict(ex.last_logits), rep


def correctness(device: str, scale: float = 1.0) -> list[tuple[str, str]]:
    state = Transformer(get_model_config("tiny-llama")).init_random(seed=1, std=0.05).state_dict()
    ref_out, ref_logits, _ = run_waves(state, device, "none", scale=scale)
    rows = []
    for page, chunk in ((1, 0), (16, 64)):
        out, logits, rep = run_waves(state, device, "radix", page, chunk, scale=scale)
        same_out = out == ref_out
        same_logits = all(torch.equal(logits[k], ref_logits[k]) for k in ref_logits)
        diff = max((logits[k] - ref_logits[k]).abs().max().item() for k in ref_logits)
        ok = same_out and same_logits and rep.cached_tokens > 0
        rows.append((f"radix p{page} chunk {chunk or 'off'} vs none",
                     f"{'PASS' if ok else 'FAIL'}: outputs {'equal' if same_out else 'DIFFER'}, "
                     f"logits {'bit-equal' if same_logits else f'max |diff| {diff:.3g}'}, "
                     f"cached {rep.cached_tokens:,} tokens"))
        log(f"correctness {rows[-1][0]}: {rows[-1][1]}")
    return rows


def fidelity(model: str, device: str, dtype: torch.dtype, wl_kw: dict, kv_capacity: int) -> str:
    """Calibrate, then the validate table on the support workload (markdown)."""
    from radixkv.offline.calibration.measure import Grid, calibrate, pool_slots
    from radixkv.offline.calibration.fidelity import compare_reports, run_real, run_simulated
    grid = Grid.for_device(torch.device(device)) if device != "cpu" else Grid(repeats=1)
    ex = TorchExecutor.from_config(model, max(pool_slots(grid.points()), kv_capacity), seed=0,
                                   device=device, dtype=dtype)
    t0 = time.perf_counter()
    prof = calibrate(ex, grid)
    r = prof.residuals
    log(f"calibrated {ex.name} ({ex.attention.name}) in {time.perf_counter() - t0:.0f} s: rms "
        f"{r.rms:.1%}, max {r.max_abs:.1%}, {r.outliers} outliers")
    wl = make_workload("support", **wl_kw, vocab_size=ex.args.vocab_size, seed=1)
    cfg = EngineConfig(kv_capacity=kv_capacity, cache=CacheConfig("radix"))
    real, rb = run_real(wl, cfg, ex)
    sim, sb = run_simulated(wl, cfg, prof.cost_model())
    fid = compare_reports(real, rb, sim, sb)
    lines = [f"Fidelity: {ex.name} ({ex.attention.name}), fit rms {r.rms:.1%} over {r.samples} "
             f"steps; support seed 1 (unseen by the fit)", "",
             "| metric | real s | simulated s | error |", "|---|---:|---:|---:|"]
    lines += [f"| {m.metric} | {m.real:.4f} | {m.simulated:.4f} | {m.relative_error:+.1%} |"
              for m in fid.rows]
    log(f"fidelity: worst {fid.worst.metric} {fid.worst.relative_error:+.1%}")
    return "\n".join(lines) + "\n"


def timing(model: str, device: str, dtype: torch.dtype, wl_kw: dict, kv_capacity: int,
           attention: str | None = None) -> list[dict]:
    t0 = time.perf_counter()
    ex = TorchExecutor.from_config(model, kv_capacity, seed=0, device=device, dtype=dtype,
                                   attention=attention)
    log(f"{ex.name}: {ex.args.num_params / 1e6:,.0f}M params, KV pool {ex.kv.nbytes / 2**30:.1f} GiB, "
        f"built in {time.perf_counter() - t0:.1f} s")
    wl = make_workload("support", **wl_kw, vocab_size=ex.args.vocab_size)
    none = EngineConfig(kv_capacity=kv_capacity, cache=CacheConfig("none"))
    warm = Engine(none, none.cache.build(), ex)
    warm.add_request(Request("warm-up", list(wl.requests[0].prompt), 2))
    warm.run_until_idle()
    rows: dict[str, dict] = {}
    # each twice, alternating: the first pass of a shape pays the allocator's growth, so the
    # second pass of each is the one reported
    for kind in ("none", "radix", "none", "radix"):
        cfg = EngineConfig(kv_capacity=kv_capacity, cache=CacheConfig(kind))
        eng = Engine(cfg, cfg.cache.build(), ex)
        for i, tr in enumerate(wl):
            eng.add_request(request_from_trace(tr, i))
        t0, busy0 = time.perf_counter(), ex.busy_s
        s = eng.run_until_idle().summary()
        wall, busy = time.perf_counter() - t0, ex.busy_s - busy0
        rows[kind] = (dict(cache=f"{kind} ({ex.attention.name})", requests=s["requests"], prompt=s["prompt_tokens"],
                         hit=s["hit_rate"], prefill=s["prefill_tokens"], wall=wall,
                         out=s["output_tokens"],
                         ttft=s["ttft_p50"], tps=(s["prompt_tokens"] + s["output_tokens"]) / wall,
                         steps=s["steps"]))
        log(f"{kind}: {wall:.1f} s ({busy:.1f} s in the executor), {s['prefill_tokens']:,} "
            f"prefill tokens, {s['steps']} steps")
    return [rows["radix"], rows["none"]]



def markdown(title: str, checks: list[tuple[str, str]], rows: list[dict]) -> str:
    lines = [f"## {title}", ""]
    if checks:
        lines += ["| correctness | result |", "|---|---|"] + [f"| {a} | {b} |" for a, b in checks] + [""]
    base = next(r for r in rows if r["cache"].startswith("none"))
    lines += ["| cache | requests | prompt tokens | hit rate | prefill tokens | wall s | TTFT p50 ms "
              "| tok/s | decode tok/s | steps | speed-up |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['cache']} | {r['requests']} | {r['prompt']:,} | {100 * r['hit']:.1f}% | "
                     f"{r['prefill']:,} | {r['wall']:.2f} | {1e3 * r['ttft']:.1f} | {r['tps']:,.0f} | "
                     f"{r['out'] / r['wall']:,.0f} | "
                     f"{r['steps']} | {base['wall'] / r['wall']:.2f}x |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the markdown results here (default stdout)")
    ap.add_argument("--model", default="llama-3-8b", help="named shape for the timing run")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--users", type=int, default=20)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, nargs=2, default=(16, 32), metavar=("MIN", "MAX"))
    ap.add_argument("--kv-capacity", type=int, default=131072, metavar="TOKENS")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--skip-fidelity", action="store_true", help="no calibrate + validate run")
    ap.add_argument("--threads", type=int, help="CPU intra-op threads (--dry-run: 1)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny-llama on the CPU, fp32, shorter prompts and 4 users x 2 turns of the "
                         "CPU-scaled support workload: exercises every step of the script anywhere")
    a = ap.parse_args(argv)
    wl_kw = dict(num_users=a.users, turns=a.turns, reply_len=tuple(a.new_tokens), rate=4.0)
    scale = 1.0
    if a.dry_run:
        a.model, a.device, a.dtype, a.kv_capacity, a.users = "tiny-llama", "cpu", "float32", 32768, 4
        wl_kw = {**CPU_DEFAULTS["support"], "num_users": 4, "turns": 2, "system_len": 128,
                 "fewshot_len": 256, "rag_len": 128}
        scale, a.threads = 0.4, a.threads or 1
    if a.threads:
        torch.set_num_threads(a.threads)
    if torch.device(a.device).type == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device is available (torch {torch.__version__}, "
              f"cuda build {torch.version.cuda}); run on a GPU machine, or use --dry-run "
              f"for the CPU mode", file=sys.stderr)
        return 2
    dev = torch.device(a.device)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    log(f"device {a.device} ({where}), torch {torch.__version__}")
    checks = [] if a.skip_correctness else correctness(a.device, scale)
    dtype = getattr(torch, a.dtype)
    rows = timing(a.model, a.device, dtype, wl_kw, a.kv_capacity)
    md = markdown(f"radixkv engine on {where}: {a.model} ({a.dtype}), support "
                  f"{wl_kw['num_users']} users x {wl_kw['turns']} turns", checks, rows)
    if not a.skip_fidelity:
        md += "\n" + fidelity(a.model, a.device, dtype, wl_kw, a.kv_capacity)
    other = "sdpa" if rows[0]["cache"].endswith("(paged)") else "paged"
    ref = timing(a.model, a.device, dtype, wl_kw, a.kv_capacity, attention=other)
    md += "\n" + markdown(f"attention backends: {rows[0]['cache'].split('(')[1][:-1]} vs {other}",
                          [], rows + ref)
    if a.out:
        a.out.write_text(md)
        log(f"wrote {a.out}")
    print(md)
    return 0 if all(c[1].startswith("PASS") for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
