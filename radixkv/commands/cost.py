"""The step-cost model a simulating command runs on: a named model on a named GPU at a TP
degree (`--model`, `--gpu`, `--tp`), or a measured profile (`--profile`)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from radixkv.sim.costmodel import CostModel
from radixkv.sim.profile import ProfiledCostModel, load_profile
from radixkv.validate import positive_int

DEFAULT_MODEL, DEFAULT_GPU = "llama-3-8b", "h100-sxm"


@dataclass(frozen=True)
class CostChoice:
    cost: CostModel | ProfiledCostModel
    model: str                   # the model's name, as the JSON metadata records it
    gpu: str                     # the GPU's name, or the profile's device
    kv_bytes_per_token: int      # per GPU, for --max-total-tokens given in bytes


def cost_from_args(args: argparse.Namespace) -> CostChoice:
    if args.profile is not None:
        for flag, value in (("--gpu", args.gpu), ("--tp", args.tp)):
            if value is not None:
                raise ValueError(f"{flag} {value} does not apply with --profile: the profile "
                                 f"measured one device")
        prof = load_profile(args.profile, model=args.model)
        cost = prof.cost_model()
        return CostChoice(cost, prof.model.name, f"{prof.device}:{prof.device_name} (profile)",
                          cost.model_spec.kv_bytes_per_token_per_gpu)
    tp = None if args.tp is None else positive_int(args.tp, "--tp")
    model, gpu = args.model or DEFAULT_MODEL, args.gpu or DEFAULT_GPU
    cost = CostModel.named(model, gpu, tp=tp)
    return CostChoice(cost, cost.model_spec.name, gpu, cost.model_spec.kv_bytes_per_token_per_gpu)
