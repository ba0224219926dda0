"""`radixkv generate`: real generation with a PyTorch model through the engine and a cache.

Prompts come from a file (text lines, or JSONL TraceRequests) or a workload generator. A
workload's recorded replies are forced (scripted): real logits are computed for every token,
but each reply is the recorded one, so the next turn re-sends exactly it and can hit.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from radixkv.cache.pool import round_up
from radixkv.commands._common import load_from_args
from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.shapes import MODEL_CONFIGS, ModelArgs
from radixkv.model.tokenizer import load_tokenizer
from radixkv.sched.request import Request
from radixkv.validate import positive_int
from radixkv.workloads import GENERATORS, read_jsonl

# The support agent scaled for a CPU: 20 users x 3 turns, 12 RAG requests, ~1.1k-token prompts.
CPU_DEFAULTS: dict[str, dict[str, Any]] = {
    "support": dict(num_users=20, turns=3, system_len=256, fewshot_len=768, rag_len=256,
                    msg_len=(16, 64), reply_len=(8, 32), rate=4.0),
}
DTYPES = ("bfloat16", "float16", "float32")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate", help="generate with a real PyTorch model through the engine and a cache",
        description="Run prompts or a workload through the engine with a real model over a "
                    "paged KV pool, then print per-request latency and cache totals. A workload's "
                    "recorded replies are forced: logits are really computed for every token, but "
                    "each reply is the recorded one, so the next turn re-sends exactly it and hits. "
                    "Defaults for --workload support suit a CPU: "
                    + ", ".join(f"{k}={v}" for k, v in CPU_DEFAULTS["support"].items()) + ".")
    p.add_argument("--model", default="tiny-llama", metavar="NAME|DIR",
                   help=f"a named shape with random weights ({', '.join(MODEL_CONFIGS)}) or a "
                        f"local Hugging Face checkpoint directory (default tiny-llama)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", type=Path, metavar="FILE",
                     help="one prompt per line (text), or a JSONL file of TraceRequests")
    src.add_argument("--workload", metavar="NAME|TRACE",
                     help=f"a generator ({', '.join(GENERATORS)}) or a trace file")
    p.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json (default: byte tokenizer)")
    p.add_argument("--users", type=int, metavar="N", help="workload users (support, multiturn)")
    p.add_argument("--turns", type=int, metavar="N", help="turns per user (support, multiturn)")
    p.add_argument("--rate", type=float, metavar="R", help="arrival rate of sessions per second")
    p.add_argument("--limit", type=int, metavar="N", help="use only the first N requests")
    p.add_argument("--cache", default="radix", choices=["radix", "none", "blockhash"])
    p.add_argument("--page-size", type=int, default=1, metavar="N")
    p.add_argument("--kv-capacity", type=int, default=65536, metavar="TOKENS",
                   help="KV pool size in tokens (default 65536)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="for prompts without recorded output (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass (default 1)")
    p.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the random weights, the sampling and the workload (default 0)")
    p.add_argument("--chunked-prefill", type=int, metavar="N", help="chunk size, 0 = off (default 8192)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default RADIXKV_DEVICE, else cuda if present)")
    p.add_argument("--dtype", choices=DTYPES, help="default float32 on CPU, bfloat16 on CUDA")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="CPU intra-op threads (default 1: small models are overhead-bound, and "
                        "spinning OpenMP threads collapse on a shared machine)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="bit-identical logits whatever the batch (slower)")
    p.set_defaults(func=run)


def _model_args(name: str) -> ModelArgs:
    if name in MODEL_CONFIGS:
        return MODEL_CONFIGS[name]
    if not Path(name).is_dir():
        raise ValueError(f"unknown model {name!r}: not a named shape ({', '.join(MODEL_CONFIGS)}) "
                         f"nor a checkpoint directory")
    from radixkv.model.weights import args_from_hf_config, read_hf_config
    return args_from_hf_config(read_hf_config(name), where=f"{name}/config.json")


def _prompt_requests(args, tok, sampling, eos: int | None) -> list[Request]:
    path: Path = args.prompts
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    stops = tuple(sampling.stop_token_ids) + ((eos,) if eos is not None else ())
    if path.suffix == ".jsonl" or first.lstrip().startswith("{"):
        return [request_from_trace(tr, i, replace(sampling, seed=sampling.seed + i),
                                   force=tr.output is not None, stop_ids=stops)
                for i, tr in enumerate(read_jsonl(path))]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"prompts file {str(path)!r} holds no prompt")
    return [Request(f"p{i}", tok.encode(ln, add_bos=tok.bos_id is not None), args.max_new_tokens,
                    sampling=replace(sampling, seed=sampling.seed + i), stop_ids=stops, index=i)
            for i, ln in enumerate(lines)]


def run(args: argparse.Namespace) -> int:
    import torch                                  # the torch extra is needed only here

    from radixkv.model.executor import TorchExecutor
    from radixkv.model.sampling import SamplingParams

    margs = _model_args(args.model)
    positive_int(args.threads, "--threads")
    tok = load_tokenizer(args.tokenizer)
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, args.seed, args.max_new_tokens)
    page = args.page_size
    if args.chunked_prefill and 0 < args.chunked_prefill < page:
        raise ValueError(f"--chunked-prefill {args.chunked_prefill} is below the page size {page}: "
                         f"no chunk could ever be scheduled")
    capacity = round_up(args.kv_capacity, page)
    cfg = EngineConfig(kv_capacity=capacity, cache=CacheConfig(args.cache, page),
                       sched=SchedulerConfig(**({} if args.chunked_prefill is None
                                                else {"chunked_prefill_size": args.chunked_prefill})))
    vocab = margs.vocab_size
    if args.prompts is not None:
        reqs = _prompt_requests(args, tok, sampling, margs.eos_id)
        title = f"{args.prompts}"
    else:
        args.skip_bad = False
        defaults = {**CPU_DEFAULTS.get(args.workload, {}), "vocab_size": vocab}
        wl = load_from_args(args, defaults if args.workload in GENERATORS else None)
        reqs = [request_from_trace(tr, i, sampling,
                                   max_new_tokens=None if tr.output else args.max_new_tokens)
                for i, tr in enumerate(wl)]
        title = f"{wl.name} ({len(wl)} requests)"
    bad = next((r for r in reqs if max(r.tokens + list(r.forced_output or ())) >= vocab), None)
    if bad is not None:
        raise ValueError(f"request {bad.rid!r} holds token id "
                         f"{max(bad.tokens + list(bad.forced_output or ()))} outside the model "
                         f"vocabulary [0, {vocab})")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    ex = TorchExecutor.from_config(args.model, capacity, seed=args.seed, device=args.device,
                                   dtype=dtype, batch_invariant=args.batch_invariant)
    engine = Engine(cfg, cfg.cache.build(), ex)
    for r in reqs:
        engine.add_request(r)
    t0 = time.perf_counter()
    rep = engine.run_until_idle()
    wall = time.perf_counter() - t0

    con = Console()
    table = Table(title=f"{ex.name} · {cfg.cache.label} · {title}")
    for col in ("id", "prompt", "cached", "TTFT s", "E2E s", "out"):
        table.add_column(col, justify="left" if col == "id" else "right")
    if args.prompts is not None:
        table.add_column("output", overflow="fold")
    by_id = {r.rid: r for r in engine.finished}
    for rec in sorted(rep.records, key=lambda r: by_id[r.rid].index):
        row = [rec.rid, f"{rec.prompt_tokens:,}", f"{rec.cached_tokens:,}", f"{rec.ttft:.3f}",
               f"{rec.e2e:.3f}", str(rec.output_tokens)]
        if args.prompts is not None:
            row.append(json.dumps(tok.decode(by_id[rec.rid].output), ensure_ascii=False)[1:-1])
        table.add_row(*row)
    con.print(table)
    done = rep.prompt_tokens + rep.output_tokens
    con.print(f"totals: requests {len(rep.records)} · prompt tokens {rep.prompt_tokens:,} · "
              f"cached tokens {rep.cached_tokens:,} · hit rate {100 * rep.hit_rate:.1f}% · "
              f"prefill tokens computed {rep.prefill_tokens:,} · output tokens {rep.output_tokens:,} · "
              f"retractions {rep.retractions} · wall {wall:.2f} s · "
              f"{done / max(wall, 1e-9):,.0f} tokens/s", soft_wrap=True, highlight=False)
    return 0
