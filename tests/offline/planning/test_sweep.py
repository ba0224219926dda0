"""radixkv.offline.planning.sweep: rows equal plain replays at their capacities, whichever way they were
computed; the grid; infeasible sizes; the capacity for a share of the ceiling."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.offline.planning.sweep import (ONE_PASS, REPLAY, capacity_for, capacity_grid, ceiling,
                                    lines_of, replay_hits, request_need, sweep)
from radixkv.offline.replay import pool_size, replay
from radixkv.sim.specs import MODEL_SPECS
from radixkv.workloads import make_workload

SMALL = dict(num_users=6, turns=3, system_len=120, fewshot_len=200, rag_len=150,
             msg_len=(5, 40), reply_len=(1, 40))


@pytest.fixture(scope="module")
def w():
    return make_workload("support", **SMALL)


def clock():
    return itertools.count().__next__


def plain(w, cfg: CacheConfig, capacity: int) -> int:
    """Hit tokens of radixkv.offline.replay.replay at `capacity`, on a logical clock."""
    extra = {"clock": clock()} if cfg.kind == "radix" else {}
    return replay(w, cfg.build(**extra), capacity).hit_tokens


@dataclass(frozen=True)
class Curve:
    capacities: np.ndarray
    hit_tokens: np.ndarray
    feasible: np.ndarray
    footprint_tokens: int
    peak_tokens: int
    prompt_tokens: int


def replayed_curve(requests, kind, page_size, capacities):
    """lru_hit_curve's contract, by one replay per capacity: a check of the sweep's own logic
    that does not depend on the one-pass algorithm."""
    reqs = list(requests)
    need = request_need(reqs, page_size)
    unlimited = pool_size(reqs, page_size, None)
    caps = np.array([unlimited if c is None else c - c % page_size for c in capacities],
                    dtype=np.int64)
    ok = caps >= need
    cfg = CacheConfig(kind, page_size, evict_granularity="page") if kind == "radix" else \
        CacheConfig(kind, page_size)
    hits = np.array([plain(reqs, cfg, int(c)) if f else 0 for c, f in zip(caps, ok)],
                    dtype=np.int64)
    # the peak is bounded by the unlimited pool; only the sweep's grid top depends on it
    return Curve(caps, hits, ok, unlimited, unlimited, sum(len(r.prompt) for r in reqs))


def curves():
    """The real one-pass curve when it is there, and the replayed stand-in always."""
    out = [pytest.param(replayed_curve, id="replayed")]
    try:
        from radixkv.offline.planning.onepass import lru_hit_curve
        out.append(pytest.param(lru_hit_curve, id="one-pass"))
    except ImportError:
        pass
    return out


def test_capacity_grid():
    assert capacity_grid(100, 10_000, 3, 16) == [112, 1056, 10_000]   # sqrt(112 x 10,000)
    assert capacity_grid(100, 10_000, 1, 16) == [10_000]
    assert capacity_grid(500, 400, 5, 16) == [512]
    g = capacity_grid(16, 16 * 40, 100, 16)           # more points than pages: deduplicated
    assert g == sorted(set(g)) and g[0] == 16 and g[-1] == 640 and 30 < len(g) <= 40
    assert all(c % 16 == 0 for c in capacity_grid(1, 10**6, 24, 16))


def test_capacity_for_on_a_hand_made_curve():
    caps = [1, 2, 4, 8, 16, 32]
    rates = [None, 0.10, 0.40, 0.64, 0.72, 0.80]
    assert capacity_for(caps, rates, 0.5 * 0.8) == 4          # reached exactly at 0.40
    assert capacity_for(caps, rates, 0.8 * 0.8) == 8          # 0.64, though 0.8 * 0.8 > 0.64
    assert capacity_for(caps, rates, 0.9 * 0.8) == 16         # 0.72
    assert capacity_for(caps, rates, 0.81) is None
    assert capacity_for(caps, rates, 0.0) == 2                # None is no hit rate, not 0
    assert capacity_for([8, 4, 2], [0.5, 0.6, 0.2], 0.5) == 4  # not monotone: the smallest


@pytest.mark.parametrize("curve", curves())
def test_rows_equal_replay(w, curve):
    rows = sweep(w, ["radix", "blockhash"], ["lru", "slru", "belady"], page_size=1,
                 block_size=16, points=5, model="llama-3-8b", workers=1, curve=curve)
    lines = [("radix", 1, "lru"), ("radix", 1, "slru"), ("radix", 1, "belady"),
             ("blockhash", 16, "lru")]
    assert list(dict.fromkeys((r.cache, r.page_size, r.eviction) for r in rows)) == lines
    grid = sorted({r.capacity_tokens for r in rows})
    assert 2 <= len(grid) <= 5 and all(c % 16 == 0 for c in grid)
    assert grid[0] == max(request_need(w, 1), request_need(w, 16))
    bpt = MODEL_SPECS["llama-3-8b"].kv_bytes_per_token_per_gpu
    for r in rows:
        assert r.method == (ONE_PASS if r.eviction == "lru" else REPLAY)
        assert r.capacity_bytes == r.capacity_tokens * bpt
        cfg = CacheConfig(r.cache, r.page_size, r.eviction, evict_granularity="page") \
            if r.cache == "radix" else CacheConfig(r.cache, r.page_size)
        want = replay_hits(w, cfg, r.capacity_tokens) if r.eviction == "belady" else \
            plain(w, cfg, r.capacity_tokens)
        assert r.hit_tokens == want, r
        assert r.hit_rate == want / w.num_prompt_tokens
    top = {r.line: r.hit_rate for r in rows if r.capacity_tokens == grid[-1]}
    if curve is not replayed_curve:                       # the grid ends at the footprint
        assert top["radix p1 lru"] == top["radix p1 belady"] == ceiling(w, "radix", 1)
        assert top["blockhash b16"] == ceiling(w, "blockhash", 16)
    by = {(r.line, r.capacity_tokens): r.hit_tokens for r in rows}
    for c in grid:                                        # the oracle is never beaten
        assert by["radix p1 belady", c] >= by["radix p1 lru", c]


def test_node_granularity_is_replayed_and_explicit_capacities(w):
    small = request_need(w, 16) - 16
    rows = sweep(w, ["radix"], ["lru"], page_size=4, capacities=[small, 5003, 10**6],
                 granularity="node", workers=1, curve=replayed_curve)
    assert [r.capacity_tokens for r in rows] == [small, 5000, 10**6]
    assert [r.method for r in rows] == [REPLAY] * 3
    assert rows[0].hit_rate is None and rows[0].hit_tokens is None    # too small: reported
    assert rows[0].capacity_bytes is None
    for r in rows[1:]:
        assert r.hit_tokens == plain(w, CacheConfig("radix", 4), r.capacity_tokens)


def test_infeasible_one_pass_rows_and_bad_input(w):
    need = request_need(w, 1)
    rows = sweep(w, ["radix"], ["lru"], capacities=[need - 1, need], workers=1,
                 curve=replayed_curve)
    assert [(r.capacity_tokens, r.hit_rate is None) for r in rows] == [(need - 1, True),
                                                                       (need, False)]
    with pytest.raises(ValueError, match="smaller than one page of 16"):
        sweep(w, ["blockhash"], ["lru"], capacities=[15], curve=replayed_curve)
    with pytest.raises(ValueError, match="points"):
        sweep(w, ["radix"], ["lru"], points=0, curve=replayed_curve)
    with pytest.raises(ValueError, match="none"):
        lines_of(["none"], ["lru"])
    assert lines_of(["blockhash"], ["slru", "lfu"])[0].eviction == "lru"


def test_replay_on_admit_is_called_once_per_request_in_order(w):
    """The belady oracle follows replay's admissions: the hook changes no hit."""
    cap = request_need(w, 1) + 64
    for cfg in (CacheConfig("radix", 1, "lfu"), CacheConfig("radix", 4, evict_granularity="page"),
                CacheConfig("blockhash", 16)):
        extra = {"clock": clock()} if cfg.kind == "radix" else {}
        seen: list[int] = []
        got = replay(w, cfg.build(**extra), cap, on_admit=seen.append).hits
        assert seen == list(range(len(w))) and got == plain_hits(w, cfg, cap)


def plain_hits(w, cfg, cap):
    extra = {"clock": clock()} if cfg.kind == "radix" else {}
    return replay(w, cfg.build(**extra), cap).hits


def test_belady_replay_equals_the_engine_one_request_at_a_time(w):
    """Belady in replay is the engine's belady: one request at a time, no chunking."""
    from radixkv.offline.simulate import run_config
    from radixkv.config import EngineConfig
    from radixkv.sim.costmodel import CostModel
    cap = request_need(w, 1) + 2 + 200
    cfg = CacheConfig("radix", 1, "belady")
    sched = SchedulerConfig(max_running_requests=1, chunked_prefill_size=0, dedup=False)
    rep = run_config(w, EngineConfig(cap, cfg, sched), CostModel.named("llama-3-8b", "h100-sxm"))
    assert replay_hits(w, cfg, cap) == rep.cached_tokens


def test_process_pool_gives_the_same_rows(w):
    kw = dict(caches=["radix"], evictions=["lru", "lfu"], points=3, curve=replayed_curve)
    assert sweep(w, workers=2, **kw) == sweep(w, workers=1, **kw)
