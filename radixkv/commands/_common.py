"""Options shared by the engine commands (simulate, compare): workload, model/GPU, capacity."""
from __future__ import annotations

import argparse
from pathlib import Path

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sim.specs import GPU_SPECS, MODEL_SPECS
from radixkv.replay import parse_capacity
from radixkv.validate import positive_int
from radixkv.workloads import GENERATORS, Workload, load_workload, make_workload


def add_workload_args(p: argparse.ArgumentParser, default: str | None = "support") -> None:
    p.add_argument("workload", nargs="?" if default else None, default=default,
                   metavar="WORKLOAD",
                   help=f"a generator ({', '.join(GENERATORS)}) or a trace file "
                        f"(default: {default})")
    p.add_argument("--rate", type=float, metavar="R",
                   help="arrival rate for a generator (sessions or requests per second)")
    p.add_argument("--users", type=int, metavar="N", help="users (support, multiturn)")
    p.add_argument("--turns", type=int, metavar="N", help="turns per user (support, multiturn)")
    p.add_argument("--seed", type=int, metavar="N", help="generator seed")
    p.add_argument("--limit", type=int, metavar="N", help="use only the first N requests")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed trace lines")


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="llama-3-8b", choices=sorted(MODEL_SPECS),
                   help="model spec for the cost model (default llama-3-8b)")
    p.add_argument("--gpu", default="h100-sxm", choices=sorted(GPU_SPECS),
                   help="GPU spec for the cost model (default h100-sxm)")
    p.add_argument("--kv-capacity", metavar="TOKENS|SIZE",
                   help="KV pool: tokens, or bytes (e.g. 12GiB) at the model's KV bytes/token")


def load_from_args(args: argparse.Namespace, defaults: dict | None = None) -> Workload:
    spec = args.workload
    if args.limit is not None:
        positive_int(args.limit, "--limit")
    gen = {k: v for k, v in (("rate", args.rate), ("num_users", args.users),
                             ("turns", args.turns), ("seed", args.seed)) if v is not None}
    if spec in GENERATORS:
        if spec not in ("support", "multiturn"):
            for k in ("num_users", "turns"):
                if k in gen:
                    raise ValueError(f"--{k.replace('num_', '')} applies to support/multiturn, not {spec!r}")
        wl = make_workload(spec, **{**(defaults or {}), **gen})
    else:
        if not Path(spec).is_file():
            raise FileNotFoundError(f"{spec!r} is neither a generator ({', '.join(GENERATORS)}) "
                                    f"nor an existing trace file")
        if gen:
            raise ValueError(f"generator options {sorted(gen)} do not apply to the trace {spec!r}")
        wl = load_workload(spec, skip_bad=args.skip_bad)
    if args.limit is not None:
        wl = Workload(wl.name, list(wl.requests)[:args.limit], wl.skipped, wl.block_size, wl.meta)
    return wl


def capacity_from_args(args: argparse.Namespace, default: int) -> int:
    if args.kv_capacity is None:
        return default
    bpt = MODEL_SPECS[args.model].kv_bytes_per_token_per_gpu
    return parse_capacity(args.kv_capacity, bpt)


_CACHE_KEYS = {"cache": "kind", "page": "page_size", "eviction": "eviction",
               "slru_threshold": "slru_threshold", "hash": "hash_algo"}


def parse_config_spec(spec: str) -> tuple[str, CacheConfig, dict]:
    """'name:cache=radix,page=16,eviction=lfu,policy=lpm,retract_insert=1' -> configs.
    Cache keys: cache, page, eviction, slru_threshold, hash; any other key is a
    SchedulerConfig field (policy, chunked_prefill_size, dedup, ...)."""
    name, _, body = spec.rpartition(":") if ":" in spec else ("", "", spec)
    cache_kw, sched_kw = {}, {}
    fields = SchedulerConfig.__dataclass_fields__
    for item in filter(None, body.split(",")):
        k, eq, v = item.partition("=")
        if not eq:
            raise ValueError(f"config item {item!r} in {spec!r} is not key=value")
        try:
            if k in _CACHE_KEYS:
                cache_kw[_CACHE_KEYS[k]] = int(v) if k in ("page", "slru_threshold") else v
                continue
            if k in fields:
                typ = type(getattr(SchedulerConfig(), k))
                sched_kw[k] = (v.lower() in ("1", "true", "yes")) if typ is bool else typ(v)
                continue
        except ValueError:
            raise ValueError(f"config key {k!r} in {spec!r}: bad value {v!r}") from None
        raise ValueError(f"unknown config key {k!r} in {spec!r}; cache keys: "
                         f"{', '.join(_CACHE_KEYS)}; scheduler keys: {', '.join(fields)}")
    cache = CacheConfig(**cache_kw)
    SchedulerConfig(**sched_kw)                  # validated here, with the spec still at hand
    return name or body, cache, sched_kw
