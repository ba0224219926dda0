"""`radixkv generate`: real generation with a PyTorch model through the engine and a cache.

Prompts come from a file (text lines, or JSONL TraceRequests) or a workload: a generator or a
trace file. A workload's recorded replies are forced (scripted): real logits are computed for
every token, but each reply is the recorded one, so the next turn re-sends exactly it and can
hit.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.commands.flags import add_config_flags, check_pool, configs_from_args
from radixkv.commands.inputs import add_workload_args, load_from_args
from radixkv.commands.output import (Outputs, check_file_target, console, engine_row, metadata, pct,
                                     workload_info)
from radixkv.commands.torch_flags import add_torch_flag
from radixkv.engine.engine import Engine, request_from_trace
from radixkv.sched.request import Request
from radixkv.shapes import MODEL_CONFIGS
from radixkv.argcheck import positive_int
from radixkv.workloads import GENERATORS, read_jsonl

# The support agent scaled for a CPU: 20 users x 3 turns, 12 RAG requests, ~1.1k-token prompts.
CPU_DEFAULTS: dict[str, dict[str, Any]] = {
    "support": dict(num_users=20, turns=3, system_len=256, fewshot_len=768, rag_len=256,
                    msg_len=(16, 64), reply_len=(8, 32), rate=4.0),
}
DEFAULT_TOKENS = 65536


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "generate", help="generate with a real PyTorch model through the engine and a cache",
        description="Run prompts or a workload through the engine with a real model over a "
                    "paged KV pool, then print per-request latency and cache totals. A workload's "
                    "recorded replies are forced: logits are really computed for every token, but "
                    "each reply is the recorded one, so the next turn re-sends exactly it and "
                    "hits. "
                    "Defaults for --workload support suit a CPU: "
                    + ", ".join(f"{k}={v}" for k, v in CPU_DEFAULTS["support"].items()) + ".")
    p.add_argument("--model", default="tiny-llama", metavar="NAME|DIR",
                   help=f"a named shape with random weights ({', '.join(MODEL_CONFIGS)}) or a "
                        f"local Hugging Face checkpoint directory (default: tiny-llama)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", type=Path, metavar="FILE",
                     help="one prompt per line (text), or a JSONL file of TraceRequests")
    src.add_argument("--workload", metavar="NAME|TRACE",
                     help=f"a generator ({', '.join(GENERATORS)}) or a trace file")
    add_workload_args(p, positional=False, vocab=False,
                      rate_default="4 for support, else the generator's",
                      tokenizer_help=", and to encode --prompts and decode the replies "
                                     "(default: the --model directory's tokenizer.json, else "
                                     "bytes)")
    add_config_flags(p, caches="one", scheduler=True, max_total_tokens=str(DEFAULT_TOKENS))
    g = p.add_argument_group("generation")
    g.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="for prompts without recorded output (default: 32)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 = greedy (default: 0)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="nucleus mass (default: 1)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="0 = off (default: 0)")
    add_torch_flag(g, "--device")
    add_torch_flag(g, "--dtype")
    add_torch_flag(g, "--threads", default="; small models are overhead-bound, and spinning "
                                           "OpenMP threads collapse on a shared machine")
    g.add_argument("--batch-invariant", action="store_true",
                   help="bit-identical logits whatever the batch (slower)")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write the summary, with the run's metadata, as JSON (as simulate "
                        "--json)")
    p.set_defaults(func=run)


def _prompt_requests(args, tok, sampling, eos: int | None) -> list[Request]:
    path: Path = args.prompts
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"prompts file {str(path)!r} is not UTF-8 text (byte {e.start})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    stops = tuple(sampling.stop_token_ids) + ((eos,) if eos is not None else ())
    if path.suffix == ".jsonl" or (lines and lines[0].lstrip().startswith("{")):
        return [request_from_trace(tr, i, replace(sampling, seed=sampling.seed + i),
                                   force=tr.output is not None, stop_ids=stops)
                for i, tr in enumerate(read_jsonl(path))]
    if not lines:
        raise ValueError(f"prompts file {str(path)!r} holds no prompt")
    return [Request(f"p{i}", tok.encode(ln, add_bos=tok.bos_id is not None), args.max_new_tokens,
                    sampling=replace(sampling, seed=sampling.seed + i), stop_ids=stops, index=i)
            for i, ln in enumerate(lines)]


def _refuse_workload_options(args: argparse.Namespace) -> None:
    if args.limit is not None:
        positive_int(args.limit, "--limit")
    for dest in ("rate", "users", "turns", "trace_block_size", "time_scale"):
        if getattr(args, dest) is not None:
            raise ValueError(f"--{dest.replace('_', '-')} applies to --workload, not to --prompts")
    if args.skip_bad:
        raise ValueError("--skip-bad applies to --workload, not to --prompts")


def _tokenizer_path(args: argparse.Namespace) -> str | None:
    if args.tokenizer is not None:
        return args.tokenizer
    found = Path(args.model) / "tokenizer.json"
    return str(found) if args.model not in MODEL_CONFIGS and found.is_file() else None


def run(args: argparse.Namespace) -> int:
    from radixkv.model.sampling import SamplingParams  # the torch extra is needed only here
    from radixkv.model.setup import device_name, torch_target
    from radixkv.tokenizer import load_tokenizer

    if args.json is not None:
        check_file_target(args.json, "--json")
    if args.prompts is not None:
        _refuse_workload_options(args)
    target = torch_target(args.model, args.device, args.dtype, args.threads)
    margs = target.args
    rc = configs_from_args(args, kv_bytes_per_token=target.kv_bytes_per_token,
                           default_tokens=DEFAULT_TOKENS)
    cfg = rc.engine(rc.caches[0])
    check_pool(cfg)
    target.check_kv_memory(cfg.kv_capacity)
    tok = load_tokenizer(_tokenizer_path(args))
    sampling = SamplingParams(args.temperature, args.top_p, args.top_k, rc.seed,
                              args.max_new_tokens)
    vocab = margs.vocab_size
    if args.prompts is not None:
        reqs = _prompt_requests(args, tok, sampling, margs.eos_id)[:args.limit]
        title = f"{args.prompts}"
        info = {"name": args.prompts.stem, "source": str(args.prompts), "requests": len(reqs),
                "prompt_tokens": sum(len(r.tokens) for r in reqs)}
    else:
        wl = load_from_args(args, generator_defaults=CPU_DEFAULTS.get(args.workload),
                            vocab_size=vocab, tokenizer=tok)
        reqs = [request_from_trace(tr, i, sampling,
                                   max_new_tokens=None if tr.output else args.max_new_tokens)
                for i, tr in enumerate(wl)]
        title = f"{wl.name} ({len(wl)} requests)"
        info = workload_info(wl, args.workload)
    bad = next((r for r in reqs if max(r.tokens + list(r.forced_output or ())) >= vocab), None)
    if bad is not None:
        raise ValueError(f"request {bad.rid!r} holds token id "
                         f"{max(bad.tokens + list(bad.forced_output or ()))} outside the model "
                         f"vocabulary [0, {vocab})")
    ex = target.executor(cfg.kv_capacity, seed=rc.seed, batch_invariant=args.batch_invariant,
                                   host_slots=cfg.cache.host_kv_tokens)
    engine = Engine(cfg, cfg.cache.build(), ex)
    for r in reqs:
        engine.add_request(r)
    t0 = time.perf_counter()
    rep = engine.run_until_idle()
    wall = time.perf_counter() - t0

    con = console()
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
              f"cached tokens {rep.cached_tokens:,} · hit rate {pct(rep.hit_rate)} · "
              f"prefill tokens computed {rep.prefill_tokens:,} · "
              f"output tokens {rep.output_tokens:,} · "
              f"retractions {rep.retractions} · wall {wall:.2f} s · "
              f"{done / max(wall, 1e-9):,.0f} tokens/s", soft_wrap=True, highlight=False)
    if args.json is not None:
        with Outputs() as out:
            out.write_json(args.json, metadata(info, model=args.model, gpu=device_name(target.device),
                                               max_total_tokens=cfg.kv_capacity,
                                               results=[engine_row(rep.summary())]))
        con.print(f"wrote {args.json}")
    return 0
