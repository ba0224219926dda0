"""`radixkv validate`: one workload through the real engine (TorchExecutor) and through the
simulator priced by a profile, TTFT / E2E percentiles and makespan side by side with the
relative error of each (radixkv.calibration.fidelity)."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.commands.flags import add_config_flags, check_pool, configs_from_args
from radixkv.commands.generate import CPU_DEFAULTS as GENERATE_DEFAULTS
from radixkv.commands.inputs import add_workload_args, load_from_args
from radixkv.commands.output import (Outputs, check_file_target, console, metadata, pct,
                                     workload_info)
from radixkv.commands.torch_flags import add_torch_flag
from radixkv.shapes import MODEL_CONFIGS
from radixkv.sim.profile import load_profile

# Workloads scaled for a tiny model on a CPU (a real run of each takes a few seconds).
CPU_DEFAULTS: dict[str, dict[str, Any]] = {
    **GENERATE_DEFAULTS,
    "multiturn": dict(num_users=12, turns=4, msg_len=(16, 96), reply_len=(8, 48), rate=2.0),
}
DEFAULT_TOKENS = 65536
TOLERANCE = 0.10


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate", help="run a workload on the real engine and the profiled simulator, compare",
        description="Run one workload through the engine on the real model (as generate) and "
                    "on the simulator priced by --profile (as simulate), and print TTFT p50/p90, "
                    "E2E p50/p90 and makespan side by side with each relative error "
                    "(simulated / real - 1). CPU-sized defaults: "
                    + "; ".join(f"{w}: " + ", ".join(f"{k}={v}" for k, v in kw.items())
                                for w, kw in CPU_DEFAULTS.items()) + ".")
    p.add_argument("--model", default="tiny-llama", metavar="NAME|DIR",
                   help=f"the real model: a named shape ({', '.join(MODEL_CONFIGS)}) or a local "
                        f"checkpoint directory; it must be the profile's (default: tiny-llama)")
    p.add_argument("--profile", type=Path, required=True, metavar="FILE",
                   help="a profile written by `radixkv calibrate` for this model and device")
    add_workload_args(p, rate_default="the CPU default above, else the generator's")
    add_config_flags(p, caches="one", scheduler=True, max_total_tokens=str(DEFAULT_TOKENS))
    add_torch_flag(p, "--device", default="the profile's device")
    add_torch_flag(p, "--threads", default=", as calibrate")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write per metric real, simulated and relative_error as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from radixkv.calibration.fidelity import compare_reports, run_real, run_simulated
    from radixkv.model.setup import model_args, torch_target  # the torch extra: only here

    if args.json is not None:
        check_file_target(args.json, "--json")
    prof = load_profile(args.profile, model=model_args(args.model).name)
    target = torch_target(args.model, args.device or prof.device, prof.dtype, args.threads)
    margs = target.args
    if target.device.type != prof.device:
        raise ValueError(f"--device {str(target.device)!r}: the profile was measured on "
                         f"{prof.device!r}")
    rc = configs_from_args(args, kv_bytes_per_token=target.kv_bytes_per_token,
                           default_tokens=DEFAULT_TOKENS)
    cfg = rc.engine(rc.caches[0])
    check_pool(cfg)
    target.check_kv_memory(cfg.kv_capacity)
    wl = load_from_args(args, generator_defaults=CPU_DEFAULTS.get(args.workload),
                        vocab_size=margs.vocab_size)
    ex = target.executor(cfg.kv_capacity, seed=rc.seed, attention=prof.backend,
                                   host_slots=cfg.cache.host_kv_tokens)
    con = console()
    with con.status(f"real run: {ex.name}, {len(wl)} requests"):
        real, real_busy = run_real(wl, cfg, ex)
    sim, sim_busy = run_simulated(wl, cfg, prof.cost_model())
    fid = compare_reports(real, real_busy, sim, sim_busy)
    table = Table(title=f"{wl.name} ({len(wl)} requests) · {cfg.cache.label} · {ex.name} "
                        f"({ex.attention.name}) vs profile {args.profile}")
    for col in ("metric", "real s", "simulated s", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for r in fid.rows:
        table.add_row(r.metric, f"{r.real:.4f}", f"{r.simulated:.4f}",
                      f"{'+' if r.relative_error >= 0 else ''}{pct(r.relative_error)}")
    con.print(table)
    w = fid.worst
    con.print(f"worst: {w.metric} {w.relative_error:+.1%} · steps real {real.steps}, simulated "
              f"{sim.steps} · {'within' if fid.within(TOLERANCE) else 'OUTSIDE'} "
              f"{TOLERANCE:.0%}", highlight=False)
    if args.json is not None:
        doc = metadata(workload_info(wl, args.workload), model=margs.name,
                       gpu=f"{prof.device}:{prof.device_name}", max_total_tokens=cfg.kv_capacity,
                       results=[{"metric": r.metric, **r.as_dict()} for r in fid.rows],
                       timing=prof.cost_model().timing)
        doc["metrics"] = {r.metric: r.as_dict() for r in fid.rows}
        doc["profile"] = str(args.profile)
        with Outputs() as out:
            out.write_json(args.json, doc)
        con.print(f"wrote {args.json}")
    return 0
