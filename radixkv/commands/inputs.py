"""What a run is given, shared by the subcommands: the workload (a generator or a trace file,
with the generator's and the readers' options) and the simulated model and GPU."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from radixkv.engine.presets import ENGINES
from radixkv.sim.specs import GPU_SPECS, MODEL_SPECS
from radixkv.argcheck import choice, positive_int, positive_number
from radixkv.workloads import (GENERATORS, TraceFormatError, Workload, load_workload,
                               trace_format)
from radixkv.workloads.generators import KIND_NAMES
from radixkv.workloads.sessions import ARRIVAL_MODES, SessionArrivals
from radixkv.workloads.traces import MOONCAKE_BLOCK_SIZE

# generator option -> its flag
_GENERATOR_FLAGS = {"rate": "--rate", "num_users": "--users", "turns": "--turns",
                    "vocab_size": "--vocab-size"}


def add_workload_args(p: argparse.ArgumentParser, *, positional: bool = True,
                      default: str | None = None, vocab: bool = True,
                      rate_default: str = "the generator's", tokenizer_help: str = "") -> None:
    """WORKLOAD (positional unless the command names it itself) and the generator and reader
    options."""
    if positional:
        p.add_argument("workload", nargs="?" if default else None, default=default,
                       metavar="WORKLOAD",
                       help=f"a generator ({', '.join(GENERATORS)}) or a trace file: radixkv "
                            f"JSONL, a hash-id trace (Mooncake style) or an OpenAI chat log"
                            + (f" (default: {default})" if default else ""))
    g = p.add_argument_group("workload")
    g.add_argument("--rate", type=float, metavar="R",
                   help=f"generator arrival rate, sessions or requests per second; inf: all at "
                        f"t=0 (default: {rate_default})")
    g.add_argument("--users", type=int, metavar="N",
                   help="users of the support and multiturn generators (default: the generator's)")
    g.add_argument("--turns", type=int, metavar="N",
                   help="turns per user of the support and multiturn generators (default: the "
                        "generator's)")
    if vocab:
        g.add_argument("--vocab-size", type=int, metavar="N",
                       help="token range of a generator or of a hash-id trace's expansion "
                            "(default: 32000)")
    g.add_argument("--limit", type=int, metavar="N",
                   help="use only the first N requests (default: all)")
    g.add_argument("--skip-bad", action="store_true",
                   help="skip malformed trace lines instead of stopping at the first")
    g.add_argument("--trace-block-size", type=int, metavar="N",
                   help=f"tokens per hash id of a hash-id trace (default: {MOONCAKE_BLOCK_SIZE}, "
                        f"Mooncake's)")
    g.add_argument("--time-scale", type=float, metavar="X",
                   help="multiply every arrival time by X: 0.5 sends the same requests in half "
                        "the time (default: 1)")
    g.add_argument("--tokenizer", metavar="PATH",
                   help="a Hugging Face tokenizer.json, to read an OpenAI chat-log file"
                        + tokenizer_help)


def add_model_args(p: argparse.ArgumentParser) -> None:
    """--model, --gpu, --tp, --engine, --timing and --profile; radixkv.commands.cost resolves
    them."""
    g = p.add_argument_group("simulated hardware")
    g.add_argument("--model", choices=sorted(MODEL_SPECS), metavar="NAME",
                   help=f"model of the cost model and its KV bytes per token: "
                        f"{', '.join(sorted(MODEL_SPECS))} (default: llama-3-8b; with "
                        f"--profile, the profile's)")
    g.add_argument("--gpu", choices=sorted(GPU_SPECS), metavar="NAME",
                   help=f"GPU of the cost model: {', '.join(sorted(GPU_SPECS))} "
                        f"(default: h100-sxm)")
    g.add_argument("--tp", type=int, metavar="N",
                   help="tensor-parallel degree: FLOPs and bytes split over N GPUs, two "
                        "all-reduces per layer over the GPU's link (default: the model's, 1 "
                        "for llama-3-8b)")
    g.add_argument("--engine", choices=list(ENGINES), metavar="NAME",
                   help=f"the engine simulated, with its shipped defaults for every cache and "
                        f"scheduler flag not given (block or page size, token budget, "
                        f"running-request cap, chunked prefill and decodes, eviction) and its "
                        f"own timing tables: {', '.join(ENGINES)} (default: none, radixkv's "
                        f"own defaults; docs/engines.md names each value's source)")
    g.add_argument("--timing", metavar="NAME[:VERSION]",
                   help="what prices a step: the measured kernel tables (aiconfigurator-core) "
                        "of vllm, sglang or trtllm at a release (default: vllm, its newest "
                        "tables), or roofline (assumed sustained rates); a pair the tables "
                        "do not cover falls back to the roofline, as the output says")
    g.add_argument("--profile", type=Path, metavar="FILE",
                   help="price steps with a profile measured by `radixkv calibrate` instead of "
                        "the named GPU (its model is the profile's)")


def add_concurrency_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-concurrency", type=int, metavar="N",
                   help="closed loop: N clients, each sending its next request in trace order "
                        "when its previous one finishes (a session stays on one client), in "
                        "place of the arrival times (default: open loop, the arrival times)")


def concurrency_from_args(args: argparse.Namespace) -> int | None:
    """--max-concurrency, checked: None for open loop. Refuses the options that only set
    arrival times, which the closed loop replaces (the order of a generator's requests does
    not depend on its rate)."""
    n = args.max_concurrency
    if n is None:
        return None
    n = positive_int(n, "--max-concurrency")
    for flag, value in (("--rate", args.rate), ("--time-scale", args.time_scale)):
        if value is not None:
            raise ValueError(f"{flag} sets arrival times, which --max-concurrency replaces; "
                             f"give one or the other")
    return n


def add_arrivals_args(p: argparse.ArgumentParser) -> None:
    """--arrivals and --think-time; arrivals_from_args reads them."""
    g = p.add_argument_group("arrivals")
    g.add_argument("--arrivals", metavar="MODE",
                   help="trace: every request at its arrival time; session: open loop with "
                        "sessions, a session's first turn at its arrival time and each later "
                        "turn --think-time after its previous turn's reply finished (default: "
                        "trace)")
    g.add_argument("--think-time", metavar="SECONDS",
                   help="with --arrivals session: seconds from a reply to the next turn of its "
                        "session; exp:SECONDS draws each turn's think time exponential with "
                        "that mean, seeded by --seed (default: 0)")


def arrivals_from_args(args: argparse.Namespace,
                       clients: int | None = None) -> SessionArrivals | None:
    """--arrivals and --think-time (exponential ones seeded by --seed), checked: None for
    trace arrivals. Refuses --think-time without session arrivals, and session arrivals (open
    loop) with the closed loop's `clients` (--max-concurrency)."""
    mode = "trace" if args.arrivals is None else choice(args.arrivals, "--arrivals",
                                                         ARRIVAL_MODES)
    if mode == "trace":
        if args.think_time is not None:
            raise ValueError(f"--think-time applies to --arrivals session, not to --arrivals "
                             f"{mode}")
        return None
    if clients is not None:
        raise ValueError("--arrivals session is open loop and --max-concurrency closed loop; "
                         "give one or the other")
    return SessionArrivals.parse("0" if args.think_time is None else args.think_time,
                                 0 if args.seed is None else args.seed)


def arrivals_meta(arrivals: SessionArrivals | None) -> dict:
    """What a run's JSON adds for its arrivals: nothing for trace arrivals."""
    return {} if arrivals is None else arrivals.meta()


def arrivals_label(arrivals: SessionArrivals | None) -> str:
    """" · session arrivals, think time 5 s" for a title; "" for trace arrivals."""
    return "" if arrivals is None else f" · session arrivals, {arrivals.describe()}"


def _kind(spec: str) -> str:
    """"generator", or the trace_format of an existing file."""
    if spec in GENERATORS:
        return "generator"
    if not Path(spec).is_file():
        raise FileNotFoundError(f"{spec!r} is neither a generator ({', '.join(GENERATORS)}) "
                                f"nor an existing trace file")
    return trace_format(spec)


def _what(spec: str, kind: str) -> str:
    return f"the generator {spec!r}" if kind == "generator" else \
        f"{spec!r} (a {KIND_NAMES.get(kind, kind)})"


def load_from_args(args: argparse.Namespace, *, generator_defaults: dict | None = None,
                   vocab_size: int | None = None, tokenizer: Any = None,
                   seed_for_traces: bool = True) -> Workload:
    """The workload args.workload names, with the options given. `vocab_size` is the token
    range of a generator or a hash-id trace when --vocab-size is not given; `tokenizer`, when
    the command has one anyway, reads an OpenAI chat log (else --tokenizer is loaded for it
    and refused for any other workload); --seed of a command without a scheduler
    (seed_for_traces=False) applies to generators only. Refuses an option that does not apply
    and a workload without requests."""
    spec = args.workload
    limit = None if args.limit is None else positive_int(args.limit, "--limit")
    kind = _kind(spec)
    gen = {k: getattr(args, a) for k, a in (("rate", "rate"), ("num_users", "users"),
                                            ("turns", "turns"), ("vocab_size", "vocab_size"))
           if getattr(args, a, None) is not None}
    if args.trace_block_size is not None and kind != "hash_ids":
        raise ValueError(f"--trace-block-size applies to hash-id traces, not to "
                         f"{_what(spec, kind)}")
    if args.tokenizer is not None and tokenizer is None and kind != "openai_chat":
        raise ValueError(f"--tokenizer applies to OpenAI chat logs, not to {_what(spec, kind)}")
    vocab = {} if vocab_size is None else {"vocab_size": vocab_size}
    if kind == "generator":
        if spec not in ("support", "multiturn"):
            for k in ("num_users", "turns"):
                if k in gen:
                    raise ValueError(f"{_GENERATOR_FLAGS[k]} applies to the support and "
                                     f"multiturn generators, not to {spec!r}")
        if args.seed is not None:
            gen["seed"] = args.seed
        kw = {**(generator_defaults or {}), **vocab, **gen}
    else:
        if args.seed is not None and not seed_for_traces:
            raise ValueError(f"--seed applies to generators, not to {_what(spec, kind)}")
        for k in gen:
            if not (k == "vocab_size" and kind == "hash_ids"):
                also = " and hash-id traces" if k == "vocab_size" else ""
                raise ValueError(f"{_GENERATOR_FLAGS[k]} applies to generators{also}, not to "
                                 f"{_what(spec, kind)}")
        kw = {"skip_bad": args.skip_bad}
        if kind == "hash_ids":
            if args.trace_block_size is not None:
                positive_int(args.trace_block_size, "--trace-block-size")
            kw.update(vocab, **gen, block_size=args.trace_block_size, limit=limit)
        elif kind == "openai_chat":
            if tokenizer is None and args.tokenizer is not None:
                from radixkv.tokenizer import load_tokenizer
                tokenizer = load_tokenizer(args.tokenizer)
            kw["tokenizer"] = tokenizer             # None: the reader asks for --tokenizer
    try:
        w = load_workload(spec, **kw)
    except TraceFormatError as e:
        raise e.with_hint("--skip-bad skips such lines") from None
    if limit is not None and len(w) > limit:
        w = Workload(w.name, w.requests[:limit], w.skipped, w.block_size, w.meta)
    if args.time_scale is not None:
        w = w.scaled(positive_number(args.time_scale, "--time-scale"))
    if not len(w):
        skipped = f" ({w.skipped:,} bad lines skipped)" if w.skipped else ""
        raise ValueError(f"workload {spec!r} has no requests{skipped}")
    return w

