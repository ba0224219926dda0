"""`radixkv validate`: one workload through the real engine (TorchExecutor) and through the
simulator priced by a profile, TTFT / E2E percentiles and makespan side by side with the
relative error of each (radixkv.offline.calibration.fidelity): the real figures are the median of
--real-runs timed runs after an untimed pass, with how far those runs spread."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from radixkv.commands.flags import add_config_flags, check_pool, configs_from_args
from radixkv.commands.generate import CPU_DEFAULTS as GENERATE_DEFAULTS
from radixkv.commands.inputs import add_workload_args, load_from_args
from radixkv.commands.output import (Outputs, check_file_target, console, metadata, pct,
                                     workload_info)
from radixkv.commands.torch_flags import add_torch_flag
from radixkv.shapes import MODEL_CONFIGS
from radixkv.sim.profile import load_profile
from radixkv.argcheck import positive_int

if TYPE_CHECKING:
    from rich.console import Console

    from radixkv.config import EngineConfig
    from radixkv.model.executor import TorchExecutor
    from radixkv.offline.calibration.fidelity import Fidelity, KindError, RealRuns
    from radixkv.shapes import ModelArgs
    from radixkv.sim.profile import Profile
    from radixkv.workloads import Workload

# Workloads scaled for a tiny model on a CPU (a real run of each takes a few seconds).
CPU_DEFAULTS: dict[str, dict[str, Any]] = {
    **GENERATE_DEFAULTS,
    "multiturn": dict(num_users=12, turns=4, msg_len=(16, 96), reply_len=(8, 48), rate=2.0),
    "fewshot": dict(num_questions=100, preamble_len=1024, question_len=(16, 64),
                    output_len=(8, 48), rate=4.0),
    "tree": dict(num_trees=3, branching=3, depth=2, root_len=768, reply_len=(16, 64), rate=1.0),
    "rag": dict(num_requests=100, num_docs=40, doc_len=512, system_len=128,
                question_len=(16, 64), output_len=(8, 48), rate=2.0),
}
DEFAULT_TOKENS = 65536
TOLERANCE = 0.10
REAL_RUNS = 5


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "validate", help="run a workload on the real engine and the profiled simulator, compare",
        description="Run one workload through the engine on the real model (as generate) and "
                    "on the simulator priced by --profile (as simulate), and print TTFT p50/p90, "
                    "E2E p50/p90 and makespan side by side with each relative error "
                    "(simulated / real - 1). The real figures are the median of --real-runs "
                    "timed runs after one untimed pass of the workload, which meets each step "
                    "shape for the first time. CPU-sized defaults: "
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
    p.add_argument("--real-runs", type=int, default=REAL_RUNS, metavar="N",
                   help=f"timed runs of the workload on the real engine, after an untimed one; "
                        f"each figure's median is compared, and the runs' spread printed beside "
                        f"it (default: {REAL_RUNS})")
    p.add_argument("--speed-check", action="store_true",
                   help="re-time a dozen of the profile's grid steps before and after the real "
                        "runs, print how much faster or slower this machine runs now, and add "
                        "the errors of a simulation at that speed (a shared machine drifts)")
    p.add_argument("--steps", action="store_true",
                   help="also price each of the timed real runs' steps by the profile and "
                        "print, per kind of step (prefill, decodes by batch size), the real "
                        "seconds and the error of the priced ones: where the profile misses, "
                        "apart from how the two sides' schedules differ")
    p.add_argument("--json", type=Path, metavar="OUT",
                   help="also write per metric real, simulated and relative_error as JSON")
    p.set_defaults(func=run)


def _signed(x: float) -> str:
    return f"{'+' if x >= 0 else ''}{pct(x)}"


@dataclass(frozen=True)
class _Outcome:
    """What one validate run measured: the real runs and the simulation of the same workload,
    compared figure by figure."""
    runs: RealRuns                  # the timed real runs (and the untimed pass)
    spread: dict[str, float]        # per figure: the real runs' (largest - smallest) / median
    fid: Fidelity                   # the real runs' median against the simulation
    sim_steps: int                  # the simulation's engine steps
    timing: str                     # what priced the simulated steps (the profile)
    speeds: list[float]             # --speed-check: the machine's speed before, after; else []
    speed: float | None             # their geometric mean; None without --speed-check
    at: Fidelity | None             # the real runs against a simulation at `speed`
    kinds: list[KindError] | None   # --steps: the timed real runs' steps priced by kind


def run(args: argparse.Namespace) -> int:
    prof, margs, cfg, wl, ex = _setup(args)
    con = console()
    out = _measure(args, con, prof, cfg, wl, ex)
    _print_comparison(con, args, wl, cfg, ex, out)
    if out.kinds is not None:
        _print_step_kinds(con, out.kinds)
    if args.json is not None:
        doc = _json_doc(args, wl, margs.name, prof, cfg, out)
        with Outputs() as files:
            files.write_json(args.json, doc)
        con.print(f"wrote {args.json}")
    return 0


def _setup(args: argparse.Namespace
           ) -> tuple[Profile, ModelArgs, EngineConfig, Workload, TorchExecutor]:
    """The arguments checked, and what they name: (the profile, the real model's shape, the
    engine configuration, the workload, the real executor with its KV pool)."""
    from radixkv.model.setup import model_args, torch_target  # the torch extra: only here

    positive_int(args.real_runs, "--real-runs")
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
    return prof, margs, cfg, wl, ex


def _measure(args: argparse.Namespace, con: Console, prof: Profile, cfg: EngineConfig,
             wl: Workload, ex: TorchExecutor) -> _Outcome:
    """The real runs on `ex` (with --speed-check, the machine's speed timed before and after
    them), the simulation priced by `prof`, and with --speed-check one more at the measured
    speed; each simulation compared with the real runs' median."""
    from radixkv.offline.calibration.fidelity import (StepLog, check_requests, compare, figures,
                                              price_steps, run_real_runs, run_simulated,
                                              speed_check)
    speeds: list[float] = []

    def check_speed() -> None:
        if args.speed_check:
            with con.status("speed check: re-timing the profile's grid steps"):
                speeds.append(speed_check(ex, prof))

    check_speed()
    with con.status(f"real runs: {ex.name}, {len(wl)} requests, an untimed pass and "
                    f"{args.real_runs} timed"):
        log = StepLog(ex) if args.steps else None
        runs = run_real_runs(wl, cfg, log or ex, args.real_runs)
    check_speed()
    cost = prof.cost_model()
    kinds = None if log is None else price_steps(log.steps, cost)
    sim, sim_busy = run_simulated(wl, cfg, cost)
    check_requests(runs.requests, sim)
    real, spread = runs.median(), runs.spread()
    fid = compare(real, figures(sim, sim_busy))
    speed = math.sqrt(speeds[0] * speeds[1]) if speeds else None
    at = None if speed is None else compare(
        real, figures(*run_simulated(wl, cfg, prof.cost_model(speed))))
    return _Outcome(runs, spread, fid, sim.steps, cost.timing, speeds, speed, at, kinds)


def _print_comparison(con: Console, args: argparse.Namespace, wl: Workload, cfg: EngineConfig,
                      ex: TorchExecutor, out: _Outcome) -> None:
    """The table of each figure, real against simulated (and at the measured speed), then
    what the real figures are, the worst error against TOLERANCE, and the speed check's."""
    fid, at, speed = out.fid, out.at, out.speed
    table = Table(title=f"{wl.name} ({len(wl)} requests) · {cfg.cache.label} · {ex.name} "
                        f"({ex.attention.name}) vs profile {args.profile}")
    cols = ["metric", "real s", "real spread", "simulated s", "error"] + \
        ([] if at is None else [f"simulated x{speed:.2f} s", f"error x{speed:.2f}"])
    for col in cols:
        table.add_column(col, justify="left" if col == "metric" else "right")
    for i, r in enumerate(fid.rows):
        cells = [r.metric, f"{r.real:.4f}", pct(out.spread[r.metric]), f"{r.simulated:.4f}",
                 _signed(r.relative_error)]
        if at is not None:
            cells += [f"{at.rows[i].simulated:.4f}", _signed(at.rows[i].relative_error)]
        table.add_row(*cells)
    con.print(table)
    w = fid.worst
    con.print(f"real: the median of {args.real_runs} timed runs after an untimed one (spread: "
              f"their largest - smallest, over the median) · simulated steps {out.sim_steps}",
              highlight=False)
    con.print(f"worst: {w.metric} {w.relative_error:+.1%} · "
              f"{'within' if fid.within(TOLERANCE) else 'OUTSIDE'} {TOLERANCE:.0%}",
              highlight=False)
    if at is not None:
        wa, speeds = at.worst, out.speeds
        con.print(f"speed check: this machine ran the profile's steps x{speeds[0]:.3f} before "
                  f"and x{speeds[1]:.3f} after the real run; simulated at x{speed:.3f}, worst "
                  f"{wa.metric} {wa.relative_error:+.1%} · "
                  f"{'within' if at.within(TOLERANCE) else 'OUTSIDE'} {TOLERANCE:.0%}",
                  highlight=False)


def _print_step_kinds(con: Console, kinds: list[KindError]) -> None:
    """--steps: the table of the timed real runs' steps by kind, real against priced."""
    kt = Table(title="the timed real runs' steps priced by the profile, by kind")
    for col in ("steps", "real s", "share", "priced s", "error"):
        kt.add_column(col, justify="right")
    kt.add_column("kind", justify="left")
    for k in kinds:
        kt.add_row(str(k.steps), f"{k.real_s:.4f}", pct(k.share), f"{k.priced_s:.4f}",
                   _signed(k.relative_error), k.kind)
    con.print(kt)


def _json_doc(args: argparse.Namespace, wl: Workload, model: str, prof: Profile,
              cfg: EngineConfig, out: _Outcome) -> dict:
    """The --json document: the run's metadata, per figure real, simulated and relative
    error, the real runs one by one, and what --speed-check and --steps measured."""
    fid, at, speeds = out.fid, out.at, out.speeds
    doc = metadata(workload_info(wl, args.workload), model=model,
                   gpu=f"{prof.device}:{prof.device_name}", max_total_tokens=cfg.kv_capacity,
                   results=[{"metric": r.metric, **r.as_dict()} for r in fid.rows],
                   timing=out.timing)
    doc["metrics"] = {r.metric: r.as_dict() for r in fid.rows}
    doc["real_runs"] = list(out.runs.runs)
    doc["real_spread"] = out.spread
    doc["cold_run"] = out.runs.cold
    if at is not None:
        doc["speed"] = {"before": speeds[0], "after": speeds[1], "simulated_at": out.speed}
        doc["metrics_at_speed"] = {r.metric: r.as_dict() for r in at.rows}
    if out.kinds is not None:
        doc["steps"] = [{"kind": k.kind, "steps": k.steps, "real": k.real_s,
                         "priced": k.priced_s, "share": k.share,
                         "relative_error": k.relative_error} for k in out.kinds]
    doc["profile"] = str(args.profile)
    return doc
