"""The real engine on this CPU (tiny-llama, TorchExecutor): what a cached prefix buys.

1. TTFT of a request whose 2,048-token prefix is in the radix tree vs the same request cold
   (a fresh tree), on the same engine type in the same run; median of repeats, interleaved.
2. The CPU-scaled support workload (radixkv generate's default), radix cache vs no cache:
   prefill tokens computed, wall time, hit rate, TTFT p50, side by side.

    .venv/bin/python benchmarks/bench_engine.py [--prefix 2048] [--repeats 7] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixkv.commands.generate import CPU_DEFAULTS  # noqa: E402
from radixkv.config import CacheConfig, EngineConfig  # noqa: E402
from radixkv.engine.engine import Engine, request_from_trace  # noqa: E402
from radixkv.model.executor import TorchExecutor  # noqa: E402
from radixkv.sched.request import Request  # noqa: E402
from radixkv.workloads import make_workload  # noqa: E402


def ttft(eng: Engine, rid: str, prompt: list[int]) -> tuple[float, int]:
    """(TTFT seconds, cached tokens) of one request arriving alone at an idle engine."""
    eng.add_request(Request(rid, prompt, 1, arrival=eng.now))
    rec = next(r for r in eng.run_until_idle().records if r.rid == rid)
    return rec.ttft, rec.cached_tokens


def bench_ttft(model: str, prefix: int, suffix: int, repeats: int, con: Console) -> float:
    cfg = EngineConfig(kv_capacity=4 * (prefix + suffix + 64), cache=CacheConfig("radix"))
    # Two executors (same seeded weights): each engine owns its executor's KV pool.
    ex_cold, ex_hot = (TorchExecutor.from_config(model, cfg.kv_capacity, device="cpu") for _ in "ch")
    rng = np.random.default_rng(0)
    t = lambda n: rng.integers(0, ex_hot.args.vocab_size, n).tolist()  # noqa: E731
    P = t(prefix)
    hot = Engine(cfg, cfg.cache.build(), ex_hot)
    ttft(hot, "warm-up", P + t(suffix))                        # P enters the tree (and warms kernels)
    ttft(Engine(cfg, cfg.cache.build(), ex_cold), "cold-warm-up", P + t(suffix))
    cold_s, warm_s = [], []
    for i in range(repeats):                                   # interleaved: same load on both
        c, hit = ttft(Engine(cfg, cfg.cache.build(), ex_cold), f"cold{i}", P + t(suffix))
        assert hit == 0
        cold_s.append(c)
        w, hit = ttft(hot, f"warm{i}", P + t(suffix))
        assert hit == prefix, hit
        warm_s.append(w)
    cold, warm = statistics.median(cold_s), statistics.median(warm_s)
    tab = Table(title=f"TTFT, {model} on CPU: {prefix}-token prefix + {suffix}-token suffix "
                      f"(median of {repeats})")
    for col in ("request", "prefill tokens", "TTFT ms", "min ms", "max ms"):
        tab.add_column(col, justify="left" if col == "request" else "right")
    tab.add_row("cold (fresh tree)", f"{prefix + suffix:,}", f"{1e3 * cold:.1f}",
                f"{1e3 * min(cold_s):.1f}", f"{1e3 * max(cold_s):.1f}")
    tab.add_row(f"prefix cached ({prefix:,} hit)", f"{suffix:,}", f"{1e3 * warm:.1f}",
                f"{1e3 * min(warm_s):.1f}", f"{1e3 * max(warm_s):.1f}")
    con.print(tab)
    ratio = cold / warm
    con.print(f"TTFT speed-up from the cached prefix: {ratio:.1f}x (target >= 10x)")
    return ratio


def bench_support(model: str, con: Console) -> dict:
    cfg_kw = dict(kv_capacity=65536)
    rows = {}
    for kind in ("radix", "none"):
        cfg = EngineConfig(cache=CacheConfig(kind), **cfg_kw)
        ex = TorchExecutor.from_config(model, cfg.kv_capacity, device="cpu")
        wl = make_workload("support", **CPU_DEFAULTS["support"], vocab_size=ex.args.vocab_size)
        eng = Engine(cfg, cfg.cache.build(), ex)
        for i, tr in enumerate(wl):
            eng.add_request(request_from_trace(tr, i))
        t0 = time.perf_counter()
        rep = eng.run_until_idle()
        rows[kind] = (rep.summary(), time.perf_counter() - t0)
    tab = Table(title=f"support workload (CPU-scaled: {len(wl)} requests, "
                      f"{wl.num_prompt_tokens:,} prompt tokens), {model} on CPU")
    for col in ("cache", "hit rate", "prefill tokens", "wall s", "TTFT p50 ms", "tok/s"):
        tab.add_column(col, justify="left" if col == "cache" else "right")
    for kind, (s, wall) in rows.items():
        tab.add_row(kind, f"{100 * s['hit_rate']:.1f}%", f"{s['prefill_tokens']:,}", f"{wall:.2f}",
                    f"{1e3 * s['ttft_p50']:.1f}",
                    f"{(s['prompt_tokens'] + s['output_tokens']) / wall:,.0f}")
    con.print(tab)
    (r, wr), (n, wn) = rows["radix"], rows["none"]
    con.print(f"radix vs none: {n['prefill_tokens'] / max(r['prefill_tokens'], 1):.1f}x fewer prefill "
              f"tokens, {wn / wr:.2f}x faster wall time")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--prefix", type=int, default=2048)
    ap.add_argument("--suffix", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="CPU intra-op threads (default 1)")
    ap.add_argument("--skip-support", action="store_true", help="only the TTFT benchmark")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    con = Console()
    bench_ttft(a.model, a.prefix, a.suffix, a.repeats, con)
    if not a.skip_support:
        bench_support(a.model, con)
    return 0


if __name__ == "__main__":
    sys.exit(main())
