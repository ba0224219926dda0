"""Sequential replay: a workload through one prefix cache, one request at a time.

Each request, in arrival order, is served as a batch-of-one server would serve it, through the
same CacheManager the engine's scheduler uses:

1. `admit`: match the prompt minus its last token (that token is always recomputed, as in
   vLLM's len - 1 rule), lock the hit, and allocate slots for the rest of the prompt from a
   `SlotPool` of `capacity` tokens, evicting from the cache when the pool is short;
2. `cache_req(finished=False)` (when it has output): the prefilled prompt enters the cache (a
   tree node ends at the prompt, as in the engine) and the lock moves to its end;
3. `grow` for the output, then `cache_req(finished=True)`: insert prompt + output, free the
   unused tail of the last page, and unlock.

These are the engine's calls in the engine's order, so a replay and an engine run with one
request at a time and no chunking see the same hits, under eviction too.
The result is a frozen `ReplayStats`: hit tokens over prompt tokens, evicted tokens, cache
footprint (peak nodes or blocks, orphaned and duplicate blocks) and CPU cost per request.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from radixkv.cache.base import CacheReq, PrefixCache
from radixkv.cache.key import RadixKey
from radixkv.cache.manager import CacheManager
from radixkv.cache.orders import reuse_signature
from radixkv.cache.pool import SlotPool, round_up
from radixkv.sched.request import FILLER_BASE, SessionTurns
from radixkv.argcheck import is_int
from radixkv.workloads import TraceRequest


@dataclass(frozen=True)
class ReplayStats:
    cache: str                   # registry name: radix | blockhash | none
    label: str                   # name plus options: "radix p1 lru", "blockhash b16 sha256"
    requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_rate: float              # hit_tokens / prompt_tokens
    evicted_tokens: int
    orphan_blocks: int           # blockhash at the end; 0 otherwise
    peak_nodes: int              # radix: peak num_nodes(); blockhash: peak cached blocks
    duplicate_blocks: int        # blockhash: identical content cached twice; 0 otherwise
    cpu_us_per_request: float
    wall_s: float
    capacity: int                # pool size in tokens (page-rounded)
    hits: tuple[int, ...] = field(default=(), repr=False, compare=False)   # per request

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        del d["hits"]
        return d


def _needs(requests: Iterable[TraceRequest], page_size: int) -> list[int]:
    return [round_up(len(r.prompt) + r.output_len, page_size) for r in requests]


def request_need(requests: Iterable[TraceRequest], page_size: int) -> int:
    """The smallest pool (tokens) that holds every request alone: its page-rounded prompt +
    output (0 for no requests)."""
    return max(_needs(requests, page_size), default=0)


def pool_size(requests: Iterable[TraceRequest], page_size: int, capacity: int | None) -> int:
    """Slots for the pool: `capacity` rounded down to whole pages, or with capacity None the
    workload's total page-rounded prompt + output tokens (nothing is ever evicted).
    Raises ValueError when one request's page-rounded prompt + output exceeds it."""
    reqs = list(requests)
    need = _needs(reqs, page_size)
    if capacity is None:
        return max(sum(need), page_size)
    if not is_int(capacity) or capacity < 1:
        raise ValueError(f"capacity must be a positive number of tokens, got {capacity!r}")
    slots = int(capacity) - int(capacity) % page_size
    if slots < page_size:
        raise ValueError(f"capacity {int(capacity):,} tokens is smaller than one page of {page_size}")
    i = max(range(len(need)), key=need.__getitem__, default=None)
    if i is not None and need[i] > slots:
        raise ValueError(f"capacity {int(capacity):,} tokens is smaller than one request: "
                         f"{reqs[i].id!r} needs {need[i]:,} (prompt + output in pages of {page_size})")
    return slots


def computed_output(r: TraceRequest, filler: int) -> tuple[Any, int]:
    """The output tokens whose KV a serving engine computes for `r`, and the filler counter
    after them. A recorded output is scripted: every token is fed back (the stop follows it).
    A record with only a length gets filler ids (above any vocabulary, never repeated), as the
    simulated GPU samples them; the last sampled token is never fed back, so output_len - 1 of
    them have KV."""
    if r.output is not None:
        return r.output, filler
    n = max(r.output_len - 1, 0)
    return (FILLER_BASE + (filler + np.arange(n)) % FILLER_BASE).astype(np.uint32), filler + n


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a simulation: a loaded trace holds tens of millions
    of token ids in tuples and lists, which every full collection walks (half the time of a
    Mooncake run with KV events); what a simulation drops, reference counting frees, except
    its cycles (trees, engines and their clusters): a caller running whole simulations one
    after another in one process collects them (`collect_simulation`)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def collect_simulation() -> None:
    """Free the cycles of the simulations that ended: left to the collector's own schedule,
    which the paused collector put off, a process running simulation after simulation grew by
    one simulation's memory each time."""
    gc.collect()


def replay(requests: Iterable[TraceRequest], cache: PrefixCache, capacity: int | None = None,
           *, check: bool = False, progress: Callable[[int], Any] | None = None,
           on_admit: Callable[[int], Any] | None = None) -> ReplayStats:
    """Replay `requests` (a Workload or any iterable of TraceRequest, in arrival order)
    through `cache` (reset first). `check=True` asserts the cache invariants and slot
    conservation after every request; `progress(n)` is called with the requests done so far
    every 64 requests and at the end; `on_admit(i)` once request i holds its prompt's slots,
    where the engine's scheduler reports an admission (a belady oracle follows it)."""
    reqs = list(requests)
    ps = cache.page_size
    slots_total = pool_size(reqs, ps, capacity)
    cache.reset()
    mgr = CacheManager(cache, SlotPool(slots_total, page_size=ps))
    with collector_paused():
        stats = _replay(reqs, cache, mgr, slots_total, check, progress, on_admit)
    return stats


def _replay(reqs: list[TraceRequest], cache: PrefixCache, mgr: CacheManager, slots_total: int,
            check: bool, progress, on_admit) -> ReplayStats:
    ps = cache.page_size
    hits: list[int] = []
    turns = SessionTurns()                                # as the engine numbers them
    prompt_tokens = peak = filler = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for i, r in enumerate(reqs):
        key = RadixKey(r.prompt, r.extra_key, r.cache_salt)
        out, filler = computed_output(r, filler)
        mgr.tick(r.arrival)                               # pins expire on the trace's clock
        req = CacheReq(key, priority=r.priority, pin_ttl=r.pin_ttl)
        hit = mgr.admit(req, key[:-1], len(key))          # match, lock, slots for the prompt
        if hit is None:
            raise ValueError(f"capacity {slots_total:,} tokens is smaller than one request: "
                             f"{r.id!r} needs {len(key) - mgr.peek(key[:-1]).prefix_len:,} "
                             f"more beyond its cached prefix, and nothing more is evictable")
        if on_admit is not None:
            on_admit(i)
        req.reuse_tag = reuse_signature(turns.next(r.session), hit)
        if len(out):
            mgr.cache_req(req, finished=False)            # prefilled: the prompt is shared
            req.key = key + out                           # decoded: slots for the output
            mgr.grow([req], round_up(len(req.key), ps) - len(req.slots))
        mgr.cache_req(req, finished=True)
        mgr.take_copies()              # no executor here: host-tier copies have nothing to move
        hits.append(hit)
        prompt_tokens += len(r.prompt)
        peak = max(peak, cache.num_entries())
        if check:
            mgr.check()
        if progress is not None and (i + 1) % 64 == 0:
            progress(i + 1)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if progress is not None:
        progress(len(reqs))
    hit_tokens, extra = sum(hits), cache.stats()
    return ReplayStats(
        cache=cache.name, label=cache.label, requests=len(reqs),
        prompt_tokens=prompt_tokens, hit_tokens=hit_tokens,
        hit_rate=hit_tokens / prompt_tokens if prompt_tokens else 0.0,
        evicted_tokens=mgr.evicted_tokens, orphan_blocks=extra.get("orphan_blocks", 0),
        peak_nodes=peak, duplicate_blocks=extra.get("duplicate_blocks", 0),
        cpu_us_per_request=cpu * 1e6 / len(reqs) if reqs else 0.0, wall_s=wall,
        capacity=slots_total, hits=tuple(hits))
