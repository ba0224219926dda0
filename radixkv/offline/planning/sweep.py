"""Hit rate against KV memory: one workload through each cache design at a range of pool sizes.

LRU curves come in one pass from `lru_hit_curve` (exact Mattson stack distances): the
blockhash cache, and the radix cache evicting whole pages (granularity "page"). Every other
order (slru, lfu, fifo, ...), belady, and radix LRU evicting whole nodes is replayed once per
capacity with the same request lifecycle as `radixkv.offline.replay.replay`, spread over the
machine's cores.

Capacities: `points` log-spaced from the smallest pool that holds the largest request to the
largest unlimited-cache footprint of the caches swept (below the first no replay can run;
from the last on nothing is ever evicted, so every order reaches its ceiling there); or
explicit `capacities`. Either way each is a whole number of pages of every cache swept
(explicit ones rounded down), so all curves share one x axis. A capacity too small for some request gives a row with `hit_rate` and
`hit_tokens` None: it is reported, never replayed.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from typing import Any, Callable, Sequence

import numpy as np

from radixkv.cache.pool import round_up
from radixkv.config import CacheConfig
from radixkv.engine.engine import request_from_trace
from radixkv.offline.replay import replay, request_need
from radixkv.offline.simulate import logical_clock
from radixkv.sim.oracle import FutureOracle
from radixkv.sim.specs import MODEL_SPECS
from radixkv.argcheck import positive_int
from radixkv.workloads import TraceRequest, Workload

MAX_WORKERS = 32          # replays are CPU-bound and independent; more only costs memory
ONE_PASS, REPLAY = "one-pass", "replay"


@dataclass(frozen=True)
class SweepRow:
    cache: str                   # radix | blockhash
    page_size: int               # radix page or blockhash block, tokens
    eviction: str                # lru, slru, lfu, ..., belady (blockhash: lru)
    capacity_tokens: int         # the KV pool, whole pages of this cache
    capacity_bytes: int | None   # capacity_tokens x the model's KV bytes per token; None: no model
    hit_rate: float | None       # hit_tokens / prompt tokens; None: a request does not fit
    hit_tokens: int | None
    method: str                  # "one-pass" or "replay"

    @property
    def line(self) -> str:
        """The curve this row belongs to: "radix p1 lru", "blockhash b16"."""
        if self.cache == "blockhash":
            return f"blockhash b{self.page_size}"
        return f"{self.cache} p{self.page_size} {self.eviction}"

    def to_json(self) -> dict[str, Any]:
        return {"line": self.line, **asdict(self)}


@dataclass(frozen=True)
class Line:
    """One curve to sweep: a cache design and its eviction order."""
    cache: str
    page_size: int
    eviction: str
    granularity: str
    slru_threshold: int = 2

    @property
    def one_pass(self) -> bool:
        return self.eviction == "lru" and (self.cache == "blockhash" or self.granularity == "page")

    def config(self) -> CacheConfig:
        if self.cache == "blockhash":
            return CacheConfig("blockhash", self.page_size)
        return CacheConfig("radix", self.page_size, self.eviction,
                           slru_threshold=self.slru_threshold,
                           evict_granularity=self.granularity)


def lines_of(caches: Sequence[str], evictions: Sequence[str], page_size: int = 1,
             block_size: int = 16, granularity: str = "page",
             slru_threshold: int = 2) -> list[Line]:
    """The curves: every eviction order for radix, LRU (its only order) for blockhash, in the
    order given; each validated as a CacheConfig."""
    out: list[Line] = []
    for kind in caches:
        if kind not in ("radix", "blockhash"):
            raise ValueError(f"a sweep compares radix and blockhash caches, not {kind!r} (the "
                             f"none cache hits nothing at any capacity)")
        orders = evictions if kind == "radix" else ["lru"]
        size = page_size if kind == "radix" else block_size
        for e in orders:
            line = Line(kind, size, e, granularity if kind == "radix" else "page", slru_threshold)
            line.config()
            if line not in out:
                out.append(line)
    if not out:
        raise ValueError("nothing to sweep: give at least one cache and eviction order")
    return out


def capacity_grid(lo: int, hi: int, points: int, step: int) -> list[int]:
    """`points` capacities log-spaced from `lo` to `hi` tokens, each a multiple of `step`
    (the first rounded up, the others to the nearest), sorted, without duplicates; the ends are
    always included."""
    positive_int(points, "points")
    lo, hi = round_up(max(lo, 1), step), round_up(max(hi, 1), step)
    if hi <= lo or points == 1:
        return [max(lo, hi)] if points == 1 else [lo]
    raw = np.geomspace(lo, hi, points)
    grid = {lo, hi} | {max(lo, int(round(x / step)) * step) for x in raw}
    return sorted(grid)


def capacity_for(capacities: Sequence[float], hit_rates: Sequence[float | None],
                 target: float) -> float | None:
    """The smallest capacity whose hit rate reaches `target` (None where a point has no hit
    rate), or None when none does. A swept point, not an interpolation: the pool it names was
    measured to reach the target. A rate within 1e-9 (relative) of the target reaches it: the
    target is a product of floats (0.8 x ceiling) that may round just above an equal rate."""
    best = None
    floor = target * (1 - 1e-9)
    for c, h in zip(capacities, hit_rates):
        if h is not None and h >= floor and (best is None or c < best):
            best = c
    return best


def ceiling(workload: Any, cache: str, page_size: int) -> float:
    """The unlimited cache's hit rate: a replay that never evicts, so the same for every
    eviction order and granularity."""
    cfg = CacheConfig(cache, page_size)
    return replay(_requests_of(workload), cfg.build()).hit_rate


def sweep(workload: Any, caches: Sequence[str], evictions: Sequence[str], page_size: int = 1,
          block_size: int = 16, capacities: Sequence[int] | None = None, points: int | None = 24,
          model: str | None = None, granularity: str = "page", slru_threshold: int = 2,
          progress: Callable[[int, int], Any] | None = None, workers: int | None = None,
          curve: Callable[..., Any] | None = None) -> list[SweepRow]:
    """Hit rate at each capacity for each cache and eviction order of `workload` (a Workload or
    a list of TraceRequest in arrival order). Rows are grouped by line, in the order of
    `caches` then `evictions`, by capacity within a line.

    `capacities` (tokens) or `points`: see the module docstring. `model` (a MODEL_SPECS name)
    adds the bytes of each capacity. `granularity` is the radix eviction granularity ("page":
    LRU in one pass; "node": replayed). `progress(done, total)` is called as each curve and
    replay finishes; `workers` caps the processes (default: the cores, at most MAX_WORKERS; 1
    runs everything here). `curve` replaces `lru_hit_curve` (same signature and result)."""
    reqs = _requests_of(workload)
    capacities = _checked_capacities(reqs, capacities, points)
    bpt = None if model is None else MODEL_SPECS[model].kv_bytes_per_token_per_gpu
    if curve is None:
        from radixkv.offline.planning.onepass import lru_hit_curve as curve
    lines = lines_of(caches, evictions, page_size, block_size, granularity, slru_threshold)
    designs = list(dict.fromkeys((ln.cache, ln.page_size) for ln in lines))
    step = math.lcm(*(ps for _, ps in designs))
    need = {d: request_need(reqs, d[1]) for d in designs}
    prompt_tokens = sum(len(r.prompt) for r in reqs)
    one_pass_lines = [ln for ln in lines if ln.one_pass]
    total = len(designs) + len(one_pass_lines)
    done = 0

    def tick(n: int = 1) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    footprint = _footprints(curve, reqs, designs, tick)
    grid = _grid_of(capacities, points, max(need.values()), max(footprint.values()), step)

    def row(ln: Line, cap: int, hit: int | None, method: str) -> SweepRow:
        return SweepRow(ln.cache, ln.page_size, ln.eviction, cap,
                        None if bpt is None else cap * bpt,
                        None if hit is None else (hit / prompt_tokens if prompt_tokens else 0.0),
                        hit, method)

    rows: dict[Line, list[SweepRow]] = {}
    for ln in one_pass_lines:
        hit_of = _one_pass_hits(curve, reqs, ln, grid, need[ln.cache, ln.page_size])
        rows[ln] = [row(ln, c, hit_of.get(c), ONE_PASS) for c in grid]
        tick()
    jobs = [(ln, c) for ln in lines if not ln.one_pass for c in grid
            if c >= need[ln.cache, ln.page_size]]
    total += len(jobs)
    hits = _run_jobs(reqs, jobs, workers, tick)
    for ln in lines:
        if not ln.one_pass:
            rows[ln] = [row(ln, c, hits.get((ln, c)), REPLAY) for c in grid]
    return [r for ln in lines for r in rows[ln]]


def _checked_capacities(reqs: list[TraceRequest], capacities: Sequence[int] | None,
                        points: int | None) -> list[int] | None:
    """`sweep`'s explicit capacities as a list of positive ints (None when not given), once
    the workload has requests and `capacities` or a positive int of `points` is given."""
    if not reqs:
        raise ValueError("the workload has no requests")
    if capacities is None and points is None:
        raise ValueError("give capacities or a number of points")
    if capacities is not None:
        capacities = [positive_int(c, "capacity") for c in capacities]
        if not capacities:
            raise ValueError("no capacities given")
    elif not isinstance(points, int) or isinstance(points, bool) or points < 1:
        raise ValueError(f"points must be a positive int, got {points!r}")
    return capacities


def _footprints(curve: Callable[..., Any], reqs: list[TraceRequest],
                designs: list[tuple[str, int]], tick: Callable[[], None]) -> dict[tuple[str, int], int]:
    """The unlimited footprint (tokens) of each (cache, page size) design, by one `curve` at
    capacity None each, `tick()` after each."""
    # the smallest pool at which nothing is evicted, whatever the order (below it the orders
    # differ; at and above it all hit the ceiling)
    footprint = {}
    for kind, ps in designs:
        footprint[kind, ps] = int(curve(reqs, kind, ps, [None]).peak_tokens)
        tick()
    return footprint


def _grid_of(capacities: list[int] | None, points: int | None, need: int, footprint: int,
             step: int) -> list[int]:
    """The capacities swept (tokens, sorted, multiples of `step`): `points` log-spaced from
    `need` (the largest request's pool) to `footprint` (the largest unlimited footprint), or
    the explicit `capacities` rounded down to whole pages, refused below one."""
    if capacities is None:
        return capacity_grid(need, footprint, points, step)
    grid = sorted({c - c % step for c in capacities})
    if grid[0] < step:
        raise ValueError(f"capacity {min(capacities):,} tokens is smaller than one page of "
                         f"{step} (whole pages of every cache swept)")
    return grid


def _one_pass_hits(curve: Callable[..., Any], reqs: list[TraceRequest], ln: Line,
                   grid: list[int], need: int) -> dict[int, int]:
    """Hit tokens by capacity of one one-pass line, from one `curve` over the capacities of
    `grid` that hold the largest request (`need` tokens); those it calls infeasible are left
    out."""
    fits = [c for c in grid if c >= need]
    hit_of: dict[int, int] = {}
    if fits:
        res = curve(reqs, ln.cache, ln.page_size, fits)
        for c, h, ok in zip(res.capacities, res.hit_tokens, res.feasible):
            if ok:
                hit_of[int(c)] = int(h)
    return hit_of


# ---- replays, one per (line, capacity), over a process pool -------------------------------
_REQUESTS: list[TraceRequest] = []      # the workload, sent once to each worker process


def _init_worker(requests: list[TraceRequest]) -> None:
    global _REQUESTS
    _REQUESTS = requests


def _replay_job(line: Line, capacity: int) -> int:
    return replay_hits(_REQUESTS, line.config(), capacity)


def _run_jobs(reqs: list[TraceRequest], jobs: list[tuple[Line, int]], workers: int | None,
              tick: Callable[[], None]) -> dict[tuple[Line, int], int]:
    """hit tokens of each (line, capacity) job; in this process when one worker suffices."""
    n = min(workers or os.cpu_count() or 1, MAX_WORKERS, len(jobs))
    out: dict[tuple[Line, int], int] = {}
    if n <= 1:
        for ln, c in jobs:
            out[ln, c] = replay_hits(reqs, ln.config(), c)
            tick()
        return out
    # spawn, not fork: the caller may run threads (a progress bar), which fork would copy
    # mid-flight; the workload travels once per worker, not once per job
    with ProcessPoolExecutor(n, mp_context=get_context("spawn"), initializer=_init_worker,
                             initargs=(reqs,)) as pool:
        # the slowest replays (smallest pools, belady) first, so no straggler ends the run
        order = sorted(jobs, key=lambda j: (j[0].eviction != "belady", j[1]))
        pending = {pool.submit(_replay_job, ln, c): (ln, c) for ln, c in order}
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in finished:
                    out[pending.pop(f)] = f.result()
                    tick()
        except BaseException:
            for f in pending:
                f.cancel()
            raise
    return out


def replay_hits(requests: Sequence[TraceRequest], cfg: CacheConfig, capacity: int) -> int:
    """Hit tokens of one replay of `requests` through a fresh cache of `cfg` in a pool of
    `capacity` tokens, on a logical clock (LRU ties break by order, never by timer
    resolution). Belady gets its future-aware oracle."""
    extra: dict[str, Any] = {}
    if cfg.kind == "radix":
        extra["clock"] = logical_clock()
    if cfg.eviction != "belady":
        return replay(requests, cfg.build(**extra), capacity).hit_tokens
    sched_reqs = [request_from_trace(tr, i) for i, tr in enumerate(requests)]
    oracle = FutureOracle(sched_reqs, cfg.page_size)
    cache = cfg.build(oracle=oracle, **extra)
    return replay(requests, cache, capacity,
                  on_admit=lambda i: oracle.admitted(sched_reqs[i])).hit_tokens


def _requests_of(workload: Any) -> list[TraceRequest]:
    return list(workload.requests if isinstance(workload, Workload) else workload)
