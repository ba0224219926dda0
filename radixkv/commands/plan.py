"""`radixkv plan TRACE --ttft-p99 S --itl-p99 S --gpus NAME[,NAME] --max-gpus N`: the cheapest
simulated deployments of the trace that meet the SLOs (radixkv/offline/planning/plan.py searches),
each with what the prefix cache saves and how the figures move at +-20 % load, the frontier of
GPUs against TTFT p99, plan.json, plan.png, and the command lines that run the chosen one."""
from __future__ import annotations

import argparse
import shlex
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from radixkv.cache.config import CacheConfig
from radixkv.commands.inputs import add_workload_args, load_from_args
from radixkv.shapes import HF_RELEASES
from radixkv.commands.output import Outputs, check_file_target, console, metadata, pct, \
    workload_info
from radixkv.offline.simulate import REFERENCE
from radixkv.offline.planning.bounds import Bounds
from radixkv.offline.planning.plan import SLO, Row, exhaustive, recommend, search
from radixkv.offline.planning.runner import Job, LocalRunner, Outcome, RayRunner
from radixkv.offline.planning.space import MODES, Candidate, Family, Setting, families
from radixkv.offline.plots.plan import frontier, plot_plan
from radixkv.router import ROUTERS
from radixkv.sched.config import SchedulerConfig
from radixkv.sim.kv_links import DEFAULT_KV_LINK, KV_LINKS
from radixkv.sim.specs import GPU_SPECS, MODEL_SPECS
from radixkv.argcheck import positive_int

LOADS = (0.8, 1.2)


def _list(text: str, kind=str) -> list:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"an empty list: {text!r}")
    try:
        return [kind(x) for x in items]
    except ValueError:
        raise ValueError(f"{text!r}: every item must be {'an int' if kind is int else 'a number'}"
                         ) from None


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "plan", help="the cheapest simulated deployment that meets TTFT / ITL / E2E targets",
        description="Search replicas (or prefill / decode splits), tensor parallelism, KV "
                    "memory, cache design, page size, eviction, scheduler order and router "
                    "for the cheapest deployment whose simulation of the whole trace meets "
                    "the SLOs; prints the best, the frontier, and the commands to run it.")
    known = len(p._actions)
    add_workload_args(p)
    # the workload's flags, passed on to the cluster_args of plan.json
    p.set_defaults(workload_flags=[(a.option_strings[0], a.dest, a.nargs == 0)
                                   for a in p._actions[known:] if a.option_strings])
    g = p.add_argument_group("targets")
    g.add_argument("--ttft-p99", type=float, metavar="S", help="TTFT p99, seconds")
    g.add_argument("--itl-p99", type=float, metavar="S",
                   help="inter-token latency p99 over every token, seconds (at least one of "
                        "the three SLOs is needed; those not given are not checked)")
    g.add_argument("--e2e-p99", type=float, metavar="S", help="end-to-end p99, seconds")
    g = p.add_argument_group("search space (comma-separated lists)")
    g.add_argument("--gpus", required=True, metavar="NAME[,NAME]",
                   help=f"GPUs to consider: {', '.join(sorted(GPU_SPECS))}")
    g.add_argument("--max-gpus", type=int, required=True, metavar="N",
                   help="the most GPUs a deployment may use")
    g.add_argument("--model", default="llama-3-8b", choices=sorted(MODEL_SPECS), metavar="NAME",
                   help="the model served (default: llama-3-8b)")
    g.add_argument("--timing", metavar="NAME[:VERSION]",
                   help="what prices a step (as `radixkv cluster --timing`; default: the "
                        "newest vLLM tables)")
    g.add_argument("--tp", default="1,2", metavar="N,...",
                   help="tensor-parallel degrees (default: 1,2)")
    g.add_argument("--kv-fractions", default="1", metavar="X,...",
                   help="KV memory per GPU, as shares of what the engine would allocate "
                        "(default: 1)")
    g.add_argument("--caches", default="radix", metavar="NAME,...",
                   help="cache designs: radix, blockhash, none (default: radix)")
    g.add_argument("--page-sizes", default="16", metavar="N,...",
                   help="page (block) sizes in tokens (default: 16)")
    g.add_argument("--evictions", default="lru", metavar="NAME,...",
                   help="the radix cache's eviction orders (default: lru)")
    g.add_argument("--schedules", default="fcfs", metavar="NAME,...",
                   help="scheduler queue orders: fcfs, lpm, ... (default: fcfs)")
    g.add_argument("--routers", default="round-robin,radixkv", metavar="NAME,...",
                   help=f"routers (of the prefill pool, when disaggregated): "
                        f"{', '.join(ROUTERS)} (default: round-robin,radixkv)")
    g.add_argument("--modes", default=",".join(MODES), metavar="NAME,...",
                   help="aggregated, disaggregated (default: both)")
    g.add_argument("--kv-link", default=DEFAULT_KV_LINK, metavar="NAME",
                   help=f"the prefill-to-decode link: {', '.join(KV_LINKS)} "
                        f"(default: {DEFAULT_KV_LINK})")
    g.add_argument("--price", action="append", default=[], metavar="GPU=USD",
                   help="price per GPU-hour of a GPU, repeatable (default: 1 for every GPU: "
                        "cost is GPU-hours)")
    g = p.add_argument_group("run")
    g.add_argument("--keep", type=int, default=3, metavar="N",
                   help="recommendations to report (default: 3)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="seed (default: 0)")
    g.add_argument("--workers", type=int, metavar="N",
                   help="processes simulating side by side (default: one per CPU)")
    g.add_argument("--ray", action="store_true",
                   help="simulate on Ray (the local cluster, or --ray-address)")
    g.add_argument("--ray-address", metavar="ADDR", help="a running Ray cluster to join")
    g.add_argument("--exhaustive", action="store_true",
                   help="simulate every size of every family (no pruning), to check the search")
    g.add_argument("--json", type=Path, default=Path("plan.json"), metavar="OUT",
                   help="where the candidates go (default: plan.json)")
    g.add_argument("--plot", type=Path, default=Path("plan.png"), metavar="PNG",
                   help="where the frontier goes (default: plan.png)")
    p.set_defaults(func=run, check_invariants=None, cache_mode=None)


def prices_of(items: list[str], gpus: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        gpu, eq, usd = item.partition("=")
        if not eq or gpu not in gpus:
            raise ValueError(f"--price {item!r}: expected GPU=USD for one of {', '.join(gpus)}")
        try:
            out[gpu] = float(usd)
        except ValueError:
            raise ValueError(f"--price {item!r}: {usd!r} is not a number") from None
        if not out[gpu] > 0:
            raise ValueError(f"--price {item!r}: the price must be positive")
    return out


def workload_argv(args: argparse.Namespace) -> list[str]:
    """The workload flags this run was given, as `radixkv cluster` takes them."""
    out: list[str] = []
    for flag, dest, switch in args.workload_flags:
        value = getattr(args, dest)
        if switch:
            out += [flag] if value else []
        elif value is not None:
            out += [flag, str(value)]
    return out


def row_json(r: Row, setting: Setting, trace: list[str]) -> dict:
    c, o, f = r.candidate, r.outcome, r.candidate.family
    size = ({"prefill_replicas": c.prefill, "decode_replicas": c.decode} if f.disaggregated
            else {"replicas": c.replicas})
    return {"gpus": c.gpus, "gpu": f.gpu, **size, "tp": f.tp, "mode": f.mode,
            "kv_fraction": f.kv_fraction, "max_total_tokens": setting.kv_tokens(f),
            "cache": f.cache, "page_size": f.page_size, "eviction": f.eviction,
            "schedule_policy": f.schedule, "router": f.router,
            "cluster_args": setting.cluster_args(c, trace[0], trace[1:]),
            "ttft_p99": o.ttft_p99,
            "itl_p99": o.itl_p99, "e2e_p99": o.e2e_p99, "hit_rate": o.hit_rate,
            "makespan_s": o.makespan_s, "gpu_hours": r.gpu_hours, "cost": r.cost,
            "cost_per_hour": per_hour(r),
            "meets_slo": r.meets}


def outcome_json(o: Outcome, slo: SLO) -> dict:
    return {"ttft_p99": o.ttft_p99, "itl_p99": o.itl_p99, "e2e_p99": o.e2e_p99,
            "hit_rate": o.hit_rate, "meets_slo": slo.meets(o)}


def launch_lines(c: Candidate, setting: Setting) -> list[str]:
    """How to run `c`: radixkv serve (simulated replicas), vLLM and SGLang."""
    f = c.family
    tokens = setting.kv_tokens(f)
    hf = HF_RELEASES.get(setting.model, setting.model)     # the model simulated, not its tables'
    rk = ["radixkv", "serve", "--executor", "sim", "--model", setting.model, "--gpu", f.gpu,
          "--tp", str(f.tp), "--cache", f.cache,
          "--block-size" if f.cache == "blockhash" else "--page-size", str(f.page_size),
          "--schedule-policy", f.schedule, "--max-total-tokens", str(tokens)]
    if f.cache == "radix":
        rk += ["--radix-eviction-policy", f.eviction]
    if not f.disaggregated and c.replicas > 1:
        rk += ["--replicas", str(c.replicas), "--router", f.router]
    cache = [] if f.cache == "none" else ["--enable-prefix-caching"]
    vllm = ["vllm", "serve", hf, "--tensor-parallel-size", str(f.tp), "--block-size",
            str(f.page_size), *(cache or ["--no-enable-prefix-caching"])]
    sgl = ["python", "-m", "sglang.launch_server", "--model-path", hf, "--tp", str(f.tp),
           "--page-size", str(f.page_size), "--schedule-policy", f.schedule,
           "--max-total-tokens", str(tokens)]
    if f.cache == "none":
        sgl.append("--disable-radix-cache")
    elif f.cache == "radix":
        sgl += ["--radix-eviction-policy", f.eviction]
    out = []
    if f.disaggregated:
        nixl = "'{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'"
        out.append(f"# {c.prefill} prefill and {c.decode} decode workers, each:")
        out.append(" ".join(map(shlex.quote, vllm)) + f" --kv-transfer-config {nixl}")
        for role in ("prefill", "decode"):
            out.append(" ".join(map(shlex.quote, sgl + ["--disaggregation-mode", role,
                                                        "--disaggregation-transfer-backend",
                                                        "nixl"])))
        out.append(f"# in front of the prefill workers: radixkv route --worker-urls ... "
                   f"--router {f.router}")
    else:
        out.append(" ".join(map(shlex.quote, rk)))
        workers = "one worker" if c.replicas == 1 else f"{c.replicas} workers"
        out.append(f"# or {workers} of vLLM or SGLang, each:")
        out.append(" ".join(map(shlex.quote, vllm)))
        out.append(" ".join(map(shlex.quote, sgl)))
        if c.replicas > 1:
            out.append(f"# in front: radixkv route --worker-urls ... --router {f.router}")
    return out


def _fig(v: float | None) -> str:
    return "-" if v is None else f"{v:,.3f}"


def cost_columns(priced: bool) -> tuple[str, str]:
    """The cost columns' headers, with their unit: dollars where --price was given, else
    GPU-hours; for the whole trace, and per hour of traffic."""
    unit = "USD" if priced else "GPU-h"
    return f"{unit} (trace)", f"{unit} / h of traffic"


def per_hour(r: Row) -> float:
    """The cost of one hour of traffic: the trace's cost over the hours it spans."""
    return r.cost * r.candidate.gpus / r.gpu_hours if r.gpu_hours else 0.0


def table(rows: list[Row], title: str, priced: bool = False) -> Table:
    t = Table(title=title)
    trace_col, hour_col = cost_columns(priced)
    for col in ("#", "deployment", "GPUs", "GPU-h (trace)", *((trace_col,) if priced else ()),
                hour_col, "TTFT p99 s", "ITL p99 s", "E2E p99 s", "hit rate", "SLO"):
        t.add_column(col, justify="left" if col == "deployment" else "right")
    for i, r in enumerate(rows, 1):
        o = r.outcome
        costs = ((f"{r.cost:.3f}",) if priced else ()) + (f"{per_hour(r):.3f}",)
        t.add_row(str(i), r.candidate.label(), str(r.candidate.gpus), f"{r.gpu_hours:.3f}",
                  *costs, _fig(o.ttft_p99), _fig(o.itl_p99), _fig(o.e2e_p99),
                  pct(o.hit_rate), "met" if r.meets else "missed")
    return t


def family_table(rows: list[Row], title: str) -> Table:
    """Each family's cheapest passing size, or its best miss: aggregated and disaggregated
    side by side."""
    t = Table(title=title)
    for col in ("family", "simulated", "passes at", "GPUs", "TTFT p99 s", "ITL p99 s",
                "hit rate"):
        t.add_column(col, justify="left" if col in ("family", "passes at") else "right")
    fams: dict = {}
    for r in rows:
        fams.setdefault(r.candidate.family, []).append(r)
    for fam, rs in sorted(fams.items(), key=lambda kv: kv[1][0].key()):
        ok = [r for r in rs if r.meets]
        pick = ok[0] if ok else min(rs, key=lambda r: r.outcome.ttft_p99 or float("inf"))
        c, o = pick.candidate, pick.outcome
        size = f"{c.prefill}P+{c.decode}D" if fam.disaggregated else f"{c.replicas}×"
        t.add_row(fam.label(), str(len(rs)), size if ok else f"none (best: {size})",
                  str(c.gpus), _fig(o.ttft_p99), _fig(o.itl_p99), pct(o.hit_rate))
    return t


def recommendations(con: Any, best: list[Row], extra: dict, slo: SLO, setting: Setting,
                    trace: list[str]) -> list[dict]:
    """Each chosen deployment at every load and without the cache, printed and as JSON."""
    recs = []
    for i, r in enumerate(best, 1):
        off = extra.get(Job(r.candidate, cache_off=True))
        loads = {f"{load:g}x": outcome_json(extra[Job(r.candidate, load)], slo)
                 for load in LOADS}
        con.print(f"#{i} {r.candidate.label()}: " + "; ".join(
            f"at {k} load TTFT p99 {_fig(v['ttft_p99'])} s, ITL p99 {_fig(v['itl_p99'])} s "
            f"({'meets' if v['meets_slo'] else 'misses'})" for k, v in loads.items()))
        if off is not None:
            con.print(f"   without the prefix cache: TTFT p99 {_fig(off.ttft_p99)} s, ITL p99 "
                      f"{_fig(off.itl_p99)} s ({'meets' if slo.meets(off) else 'misses'} the "
                      f"SLOs)")
        recs.append({"rank": i, **row_json(r, setting, trace), "load": loads,
                     "cache_off": None if off is None else outcome_json(off, slo),
                     "launch": launch_lines(r.candidate, setting)})
    return recs


def search_space(args: argparse.Namespace, setting: Setting, gpus: list[str],
                 max_gpus: int) -> list[Family]:
    """The families the flags name, each value checked, those that fit within --max-gpus."""
    modes = _list(args.modes)
    for m in modes:
        if m not in MODES:
            raise ValueError(f"--modes: unknown mode {m!r}; valid: {', '.join(MODES)}")
    space = dict(tps=_list(args.tp, int), kv_fractions=_list(args.kv_fractions, float),
                 caches=_list(args.caches), page_sizes=_list(args.page_sizes, int),
                 evictions=_list(args.evictions), schedules=_list(args.schedules),
                 routers=_list(args.routers))
    for what, values, check in (
            ("--caches", space["caches"], lambda v: CacheConfig(kind=v)),
            ("--evictions", space["evictions"], lambda v: CacheConfig(eviction=v)),
            ("--schedules", space["schedules"], lambda v: SchedulerConfig(policy=v)),
            ("--routers", space["routers"], ROUTERS.get),
            ("--tp", space["tps"], lambda v: positive_int(v, "tp")),
            ("--page-sizes", space["page_sizes"], lambda v: positive_int(v, "page size"))):
        for v in values:
            try:
                check(v)
            except ValueError as e:
                raise ValueError(f"{what} {v}: {e}") from None
    fams = families(setting, gpus=gpus, modes=modes, **space)
    fams = [f for f in fams if f.tp <= max_gpus and (not f.disaggregated or 2 * f.tp <= max_gpus)]
    if not fams:
        raise ValueError("no deployment fits: the model does not fit the GPUs at these TP "
                         "degrees within --max-gpus")
    return fams


def run(args: argparse.Namespace) -> int:
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        check_file_target(path, flag)
    slo = SLO(args.ttft_p99, args.itl_p99, args.e2e_p99)
    gpus = _list(args.gpus)
    for g in gpus:
        if g not in GPU_SPECS:
            raise ValueError(f"--gpus: unknown GPU {g!r}; valid: {', '.join(sorted(GPU_SPECS))}")
    max_gpus = positive_int(args.max_gpus, "--max-gpus")
    keep = positive_int(args.keep, "--keep")
    setting = Setting(args.model, args.timing, args.kv_link, args.seed)
    fams = search_space(args, setting, gpus, max_gpus)
    prices = prices_of(args.price, gpus)
    wl = load_from_args(args, generator_defaults=REFERENCE.generator_defaults(args.workload))
    requests = list(wl)
    con = console()
    need = max(len(r.prompt) + max(r.output_len, 1) + 1 for r in requests)
    small = [f for f in fams if setting.kv_tokens(f) < need]
    if small:                             # a worker that cannot hold the largest request
        con.print(f"skipped {len(small)} families whose KV pool cannot hold the largest "
                  f"request ({need:,} tokens): e.g. {small[0].label()}")
        fams = [f for f in fams if f not in small]
        if not fams:
            raise ValueError(f"no GPU here holds the largest request ({need:,} KV tokens)")
    started = time.monotonic()
    runner = (RayRunner(requests, setting, args.ray_address) if args.ray
              else LocalRunner(requests, setting, args.workers))
    try:
        bounds = Bounds(requests, setting, slo.ttft_p99, slo.e2e_p99)
        con.print(f"{wl.name}: {len(requests):,} requests over {bounds.span:,.0f} s · "
                  f"{len(fams)} families · up to {max_gpus} GPUs")
        if args.exhaustive:
            rows = exhaustive(setting, fams, slo, max_gpus, runner.run, prices)
            pruned, rounds = 0, 1
        else:
            found = search(setting, fams, slo, max_gpus, bounds, runner.run, prices, keep,
                           progress=lambda k, n: con.print(f"  round {k}: {n} simulated"))
            rows, pruned, rounds = found.rows, found.pruned, found.rounds
        best = recommend(rows, keep)
        jobs = [Job(r.candidate, load) for r in best for load in LOADS]
        jobs += [Job(r.candidate, cache_off=True) for r in best if r.candidate.family.cache
                 != "none"]
        extra = dict(zip(jobs, runner.run(jobs)))
    finally:
        runner.close()
    wall = time.monotonic() - started
    trace = [str(args.workload), *workload_argv(args)]
    title = (f"{wl.name}: {slo.describe()}"
             + f" · {args.model} on {', '.join(gpus)} · ≤ {max_gpus} GPUs")
    con.print(table(best, f"cheapest deployments that meet the SLOs · {title}",
                    priced=bool(args.price))
              if best else f"[bold]no simulated deployment meets the SLOs[/] · {title}")
    con.print(family_table(rows, "every family simulated: its cheapest passing size, or its "
                                 "best miss"))
    front = frontier(rows)
    con.print("frontier (GPUs: least TTFT p99): " + " · ".join(
        f"{g}: {t:.3f} s" for g, t in front))
    recs = recommendations(con, best, extra, slo, setting, trace)
    if best:
        con.print("run the chosen one:")
        for line in launch_lines(best[0].candidate, setting):
            con.print(f"  {line}", markup=False)
    con.print(f"{len(rows)} candidates simulated in {rounds} rounds, {pruned} sizes pruned, "
              f"{wall:,.1f} s")
    with Outputs() as out:
        doc = metadata(workload_info(wl, trace[0]), model=args.model, gpu=",".join(gpus),
                       max_total_tokens=None, timing=setting.replica(fams[0].gpu, fams[0].tp).cost.timing,
                       results=[row_json(r, setting, trace) for r in rows])
        out.write_json(args.json, {**doc, "slo": {"ttft_p99": slo.ttft_p99,
                                                  "itl_p99": slo.itl_p99,
                                                  "e2e_p99": slo.e2e_p99},
                                   "max_gpus": max_gpus, "kv_link": args.kv_link,
                                   "prices": prices, "families": len(fams),
                                   "simulated": len(rows), "pruned": pruned,
                                   "exhaustive": args.exhaustive, "wall_s": wall,
                                   "frontier": [{"gpus": g, "ttft_p99": t} for g, t in front],
                                   "recommendations": recs})
        plot_plan(rows, best[0] if best else None, slo.ttft_p99, out.path(args.plot), title)
    con.print(f"wrote {args.json}, {args.plot}")
    return 0
