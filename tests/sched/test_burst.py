"""A cold burst: 64 requests arrive together sharing a 2,000-token prefix nobody has cached.

Without in-batch dedup all 64 prefill the prefix in one round: 64 x 2,000 tokens, 63 x 2,000
of them wasted.
With dedup the first request prefills it alone; the other 63 are held back one round and then
hit the prefix it inserted, so only their 32-token suffixes are computed.
"""
from __future__ import annotations

import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.workloads import make_workload

from ._helpers import make_engine, requests_of

N, PREFIX, SUFFIX = 64, 2000, 32


@pytest.fixture(scope="module")
def burst():
    wl = make_workload("burst")
    reqs = list(wl)
    # the shape the numbers below rely on
    assert len(reqs) == N
    assert all(r.arrival == 0.0 for r in reqs)
    assert all(len(r.prompt) == PREFIX + SUFFIX for r in reqs)
    assert all(r.prompt[:PREFIX] == reqs[0].prompt[:PREFIX] for r in reqs)
    # suffixes diverge at their first token, so nothing beyond the prefix is shared
    assert len({r.prompt[PREFIX] for r in reqs}) == N
    return wl


def _run(wl, cache: CacheConfig, dedup: bool):
    sched = SchedulerConfig(max_prefill_tokens=200_000, chunked_prefill_size=0, dedup=dedup)
    eng = make_engine(200_000, cache, sched)
    reqs = [eng.add_request(r) for r in requests_of(wl)]
    rep = eng.run_until_idle()
    eng.check_invariants()               # once: a 200k-slot pool check per step is slow
    return eng, reqs, eng.executor.extends(0), rep


def test_burst_without_dedup_prefills_prefix_64_times(burst):
    eng, reqs, first, rep = _run(burst, CacheConfig(), dedup=False)
    assert len(first) == N                        # all 64 fit in one round
    assert [s[1] for s in first] == [0] * N
    assert [r.cached_tokens for r in reqs] == [0] * N
    assert [r.prefill_tokens for r in reqs] == [PREFIX + SUFFIX] * N
    assert sum(r.prefill_tokens for r in reqs) == N * (PREFIX + SUFFIX) == 130_048
    assert sum(r.prefill_tokens - SUFFIX for r in reqs) == N * PREFIX == 128_000
    assert rep.held_back == 0 and rep.retractions == 0 and rep.evicted_tokens == 0
    assert all(r.output == list(r.forced_output) for r in reqs)
    # the duplicates were freed at insert: the tree holds the prefix once
    assert eng.cache.total_size() == PREFIX + sum(SUFFIX + len(r.output) for r in reqs)
    assert eng.pool.used() == eng.cache.total_size()


@pytest.mark.parametrize("cache, hit", [
    (CacheConfig("radix", 1), PREFIX),
    (CacheConfig("radix", 16), PREFIX),                  # 2,000 = 125 pages of 16
    (CacheConfig("radix", 64), PREFIX - PREFIX % 64),    # 1,984: the partial page is recomputed
    (CacheConfig("blockhash", 16), PREFIX),
], ids=["radix-p1", "radix-p16", "radix-p64", "blockhash16"])
def test_burst_with_dedup_prefills_prefix_once(burst, cache, hit):
    eng, reqs, first, rep = _run(burst, cache, dedup=True)
    # round 1: only the first request; the other 63 share >= 32 tokens with it in-batch
    assert first == [("burst-0", 0, PREFIX + SUFFIX, True, "extend")]
    second = eng.executor.extends(1)
    assert [s[0] for s in second] == [f"burst-{i}" for i in range(1, N)]
    assert {(s[1], s[2]) for s in second} == {(hit, PREFIX + SUFFIX - hit)}
    assert rep.held_back == N - 1
    cached = [r.cached_tokens for r in reqs]
    assert cached.count(0) == 1 and cached[0] == 0
    assert cached[1:] == [hit] * (N - 1)
    assert [r.prefill_tokens for r in reqs] == [PREFIX + SUFFIX] + [PREFIX + SUFFIX - hit] * (N - 1)
    assert sum(r.prefill_tokens for r in reqs) == PREFIX + SUFFIX + (N - 1) * (PREFIX + SUFFIX - hit)
    # the 63 were admitted together in round 2, right after the first prefill
    t1 = reqs[0].first_token
    assert reqs[0].first_admit == 0.0
    assert all(r.first_admit == t1 for r in reqs[1:])
    assert rep.retractions == 0 and rep.evicted_tokens == 0
    assert all(r.output == list(r.forced_output) for r in reqs)


def test_burst_dedup_saves_prefill_time(burst):
    _, _, _, plain = _run(burst, CacheConfig(), dedup=False)
    _, _, _, dedup = _run(burst, CacheConfig(), dedup=True)
    assert dedup.prefill_tokens == PREFIX + SUFFIX + (N - 1) * SUFFIX == 4_048
    assert plain.prefill_tokens == 130_048
    assert dedup.cached_tokens == (N - 1) * PREFIX and plain.cached_tokens == 0
    assert dedup.makespan < plain.makespan
