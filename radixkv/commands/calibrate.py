"""`radixkv calibrate`: time the torch executor's steps over a grid and fit a step-time profile
(radixkv.sim.profile) that `simulate`, `compare` and `validate` take with --profile."""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from radixkv.commands.output import check_file_target, console
from radixkv.commands.torch_flags import add_torch_flag
from radixkv.shapes import MODEL_CONFIGS
from radixkv.argcheck import positive_int


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "calibrate", help="measure the real executor's step times and fit a simulator profile",
        description="Time TorchExecutor steps over a grid (prefill: new tokens x cached prefix "
                    "x segments per step; decode: batch x context) and fit the step-time "
                    "coefficients by non-negative least squares; write them, the grid, the "
                    "residuals and the machine as a JSON profile.")
    p.add_argument("--model", default="tiny-llama", metavar="NAME|DIR",
                   help=f"a named shape with random weights ({', '.join(MODEL_CONFIGS)}) or a "
                        f"local Hugging Face checkpoint directory (default: tiny-llama)")
    add_torch_flag(p, "--device")
    add_torch_flag(p, "--dtype")
    p.add_argument("--attention", metavar="NAME",
                   help="attention backend to time (default: the executor's for the device)")
    add_torch_flag(p, "--threads", default=", as generate")
    p.add_argument("--repeats", type=int, metavar="N",
                   help="timed runs per grid point in each pass, their mean kept (default: 5; "
                        "fewer once a point's runs add up to 0.5 s)")
    p.add_argument("--passes", type=int, metavar="N",
                   help="times the grid is timed over, each point's median kept (default: 3 "
                        "on CPU, whose speed drifts, 1 on CUDA)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="weights and grid (default: 0)")
    p.add_argument("--out", type=Path, required=True, metavar="PROFILE.json",
                   help="the profile to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from radixkv.offline.calibration.measure import Grid, calibrate, pool_slots  # torch: only here
    from radixkv.sim.profile import held_out
    from radixkv.model.setup import torch_target

    check_file_target(args.out, "--out")
    target = torch_target(args.model, args.device, args.dtype, args.threads)
    grid = Grid.for_device(target.device)
    if args.repeats is not None:
        grid = replace(grid, repeats=positive_int(args.repeats, "--repeats"))
    if args.passes is not None:
        grid = replace(grid, passes=positive_int(args.passes, "--passes"))
    grid = replace(grid, seed=args.seed)
    con = console()
    every = grid.points()
    slots, room = pool_slots(every), target.kv_room()
    if 0 < room < slots:        # the grid's largest steps do not fit beside the weights
        grid = replace(grid, max_slots=room)
        kept = grid.points()
        slots = pool_slots(kept)
        con.print(f"{len(every) - len(kept)} of {len(every)} grid steps need a KV pool over the "
                  f"{room:,} tokens that fit beside the weights: left out", highlight=False)
    target.check_kv_memory(slots)
    ex = target.executor(slots, seed=args.seed, attention=args.attention)
    t0 = time.perf_counter()
    with con.status(f"timing {ex.name} ({ex.attention.name})") as status:
        prof = calibrate(ex, grid, progress=lambda i, n: status.update(
            f"timing {ex.name} ({ex.attention.name}): step {i}/{n}"))
    r = prof.residuals
    con.print(f"{ex.name} · {ex.attention.name} · {r.samples} steps timed in "
              f"{time.perf_counter() - t0:.1f} s · fit error rms {r.rms:.1%}, median "
              f"{r.median_abs:.1%}, max {r.max_abs:.1%}, {r.outliers} outliers set aside",
              highlight=False)
    if grid.passes > 1:
        spread = sorted(x.spread for x in prof.samples)
        con.print(f"{grid.passes} passes: the slowest and fastest pass of a step differ by "
                  f"{spread[len(spread) // 2]:.1%} of its time (median), {spread[-1]:.1%} at "
                  f"most", highlight=False)
    for k, v in prof.coefficients.items():
        con.print(f"  {k:18s} {v:.4g}", highlight=False)
    spill = "none" if prof.spill_bytes is None else f"{prof.spill_bytes / 2**20:.1f} MiB"
    con.print(f"  {'spill threshold':18s} {spill} (one layer's padded KV grid)", highlight=False)
    if prof.held_out is not None:
        lin, cor = held_out(prof.model_spec, prof.samples, prof.coefficients, prof.spill_bytes,
                            corrected=False), prof.held_out
        con.print(f"held out (the {cor.samples} mixed batches, in no table): the linear form "
                  f"rms {lin.rms:.1%}, max {lin.max_abs:.1%}; with the grid's ratio rms "
                  f"{cor.rms:.1%}, max {cor.max_abs:.1%} (decode batches looked up at their "
                  f"{'longest' if prof.decode_at == 'max' else 'mean'} context)", highlight=False)
    prof.save(args.out)
    con.print(f"wrote {args.out}")
    return 0
