"""The step-cost model a simulating command runs on: a named model on a named GPU at a TP
degree (`--model`, `--gpu`, `--tp`) priced by measured kernel tables or the roofline
(`--timing`), or a measured profile (`--profile`); and the KV pool the engine would allocate
on that GPU, the default of --max-total-tokens."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from radixkv.commands.flags import RunConfig, configs_from_args, max_total_tokens
from radixkv.engine.presets import EngineDefaults, engine_defaults
from radixkv.sim.costmodel import CostModel
from radixkv.sim.measured import MeasuredCostModel, named_replica
from radixkv.sim.profile import ProfiledCostModel, load_profile
from radixkv.argcheck import positive_int

DEFAULT_MODEL, DEFAULT_GPU = "llama-3-8b", "h100-sxm"


@dataclass(frozen=True)
class CostChoice:
    cost: CostModel | MeasuredCostModel | ProfiledCostModel
    model: str                   # the model's name, as the JSON metadata records it
    gpu: str                     # the GPU's name, or the profile's device
    kv_bytes_per_token: int      # per GPU, for --max-total-tokens given in bytes
    kv_capacity: int | None = None   # tokens the engine would allocate on the GPU
    kv_source: str = ""              # how kv_capacity was reached
    gpu_bytes: int | None = None     # the GPU's memory (None: a profile's device)

    @property
    def timing(self) -> str:
        return self.cost.timing

    def default_tokens(self, fallback: int) -> int:
        """--max-total-tokens when not given: the engine's pool on the GPU (a profile's
        device has none: `fallback`)."""
        return fallback if self.kv_capacity is None else self.kv_capacity

    def describe_pool(self, tokens: int) -> str:
        """The pool as a run's header prints it, beside what the engine would allocate."""
        if self.kv_capacity is None or tokens == self.kv_capacity:
            return f"{tokens:,} KV tokens" + (f" ({self.kv_source})" if self.kv_source else "")
        return f"{tokens:,} KV tokens (the engine would allocate {self.kv_capacity:,})"


def cost_from_args(args: argparse.Namespace) -> CostChoice:
    if args.profile is not None:
        for flag, value in (("--gpu", args.gpu), ("--tp", args.tp)):
            if value is not None:
                raise ValueError(f"{flag} {value} does not apply with --profile: the profile "
                                 f"measured one device")
        for flag, value in (("--timing", args.timing), ("--engine", args.engine)):
            if value is not None:
                raise ValueError(f"{flag} {value} does not apply with --profile: the profile "
                                 f"prices the steps of the executor it measured")
        prof = load_profile(args.profile, model=args.model)
        cost = prof.cost_model()
        return CostChoice(cost, prof.model.name, f"{prof.device}:{prof.device_name} (profile)",
                          cost.model_spec.kv_bytes_per_token_per_gpu)
    tp = None if args.tp is None else positive_int(args.tp, "--tp")
    model, gpu = args.model or DEFAULT_MODEL, args.gpu or DEFAULT_GPU
    rep = named_replica(model, gpu, tp=tp, timing=args.timing or args.engine)
    spec = rep.cost.model_spec
    return CostChoice(rep.cost, spec.name, gpu, spec.kv_bytes_per_token_per_gpu,
                      rep.kv_capacity, rep.kv_source, rep.gpu_bytes)


def engine_from_args(args: argparse.Namespace, choice: CostChoice,
                     tokens: int) -> EngineDefaults | None:
    """The --engine preset for the chosen GPU and a pool of `tokens` (None: no --engine)."""
    if args.engine is None:
        return None
    return engine_defaults(args.engine, choice.gpu_bytes, choice.gpu, tokens)


def run_configs(args: argparse.Namespace, choice: CostChoice, default_tokens: int) -> RunConfig:
    """configs_from_args for a simulated GPU: the pool in tokens at the model's KV bytes per
    token (`default_tokens` without --max-total-tokens) and the --engine preset sized to it."""
    tokens = max_total_tokens(args, choice.kv_bytes_per_token, default_tokens)
    return configs_from_args(args, kv_bytes_per_token=choice.kv_bytes_per_token,
                             default_tokens=default_tokens,
                             engine=engine_from_args(args, choice, tokens))
