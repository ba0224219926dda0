"""Admission never over-commits: long seeded runs with a small KV pool (eviction and
retraction happen all the time) under every cache kind and page size, with the cache
invariants and pool slot conservation checked after every step."""
from __future__ import annotations

import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sched.request import Request, Status
from radixkv.workloads import make_workload

from ._helpers import fake_result, make_engine, make_scheduler, requests_of, toks, warm

WORKLOADS = {
    "support": (lambda: make_workload(
        "support", num_users=8, turns=3, system_len=64, fewshot_len=96, rag_len=128,
        msg_len=(8, 32), reply_len=(10, 60), think_time=0.05, rate=100.0, seed=1), "lpm"),
    "burst": (lambda: make_workload(
        "burst", num_requests=16, prefix_len=120, suffix_len=8, output_len=(20, 60), seed=2),
        "dfs-weight"),
    "multiturn": (lambda: make_workload(
        "multiturn", num_users=8, turns=3, msg_len=(8, 40), reply_len=(10, 60),
        think_time=0.05, rate=100.0, seed=3), "fcfs"),
}
CHUNK, BUDGET, MAX_RUNNING, CAPACITY = 64, 256, 16, 400


@pytest.fixture(scope="module", params=list(WORKLOADS))
def workload(request):
    make, policy = WORKLOADS[request.param]
    return request.param, make(), policy


@pytest.mark.parametrize("kind", ["radix", "blockhash", "none"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_small_pool_never_overcommits(workload, kind, page_size):
    name, wl, policy = workload
    sched = SchedulerConfig(policy=policy, max_prefill_tokens=BUDGET, chunked_prefill_size=CHUNK,
                            max_running_requests=MAX_RUNNING, init_new_token_ratio=0.05,
                            min_new_token_ratio=0.0, retract_insert=page_size == 4,
                            mixed_decode=name == "multiturn")
    eng = make_engine(CAPACITY, CacheConfig(kind, page_size), sched, check=True)
    reqs = [eng.add_request(r) for r in requests_of(wl)]
    assert max(r.prompt_len + r.max_new_tokens for r in reqs) <= CAPACITY
    assert sum(r.prompt_len for r in reqs) > 3 * CAPACITY           # the pool must turn over
    rep = eng.run_until_idle()                  # check_invariants after every step
    assert rep.retractions > 0
    if kind != "none":
        assert rep.evicted_tokens > 0
    for r in reqs:
        assert r.status is Status.FINISHED
        assert len(r.output) == len(r.forced_output) and r.output == list(r.forced_output)
        assert r.prefill_tokens == r.prompt_len - r.cached_tokens + r.recomputed_tokens
        assert r.cached_tokens % page_size == 0 and r.cached_tokens < r.prompt_len
        if kind == "none":
            assert r.cached_tokens == 0
    # budgets: at most one chunk of new tokens per step, at most MAX_RUNNING decodes
    for step in eng.executor.steps:
        assert sum(seg[2] for seg in step if seg[4] == "extend") <= CHUNK
        assert sum(seg[4] == "decode" for seg in step) <= MAX_RUNNING
    # at the end only the cache holds slots, and nothing is locked
    assert not eng.sched.running and not eng.sched.waiting and eng.sched.chunked is None
    eng.pool.check_conservation(list(eng.cache.held_slots()))
    assert eng.pool.used() == eng.cache.total_size()
    assert eng.cache.protected_size() == 0
    if kind == "none":
        assert eng.pool.used() == 0


def test_regression_dedup_hold_threshold_zero_held_everything():
    """With dedup_hold_threshold=0 (allowed by the config) every request with a short match
    was held back, since `shared - cached >= 0` always holds, even with nothing admitted
    this round to share with: nothing was ever admitted and the queue was stuck."""
    eng = make_engine(4096, CacheConfig(), SchedulerConfig(dedup_hold_threshold=0), check=True)
    a = eng.add_request(Request("a", toks(0, 40), 0, forced_output=toks(900, 3), index=0))
    b = eng.add_request(Request("b", toks(0, 30) + toks(500, 10), 0, forced_output=(), index=1))
    eng.add_request(Request("c", toks(1000, 40), 0, forced_output=(), index=2))
    eng.run_until_idle()
    # b shares 30 tokens with a in-batch: held one round; c shares nothing: admitted with a
    assert [s[0] for s in eng.executor.extends(0)] == ["a", "c"]
    assert eng.sched.counters.held_back == 1
    assert b.cached_tokens == 30
    assert a.output == toks(900, 3)


def test_regression_lone_request_is_admitted_despite_page_rounding():
    """A request that fits kv_capacity exactly (182 + 2 new = 23 pages of 8) needed its
    page-rounded fill (184) plus its own decode reserve (ceil(2 x 0.7) = 2): 186 > 184, so
    it was refused every round and never ran although nothing else was in the pool."""
    eng = make_engine(184, CacheConfig("radix", 8), SchedulerConfig(), check=True)
    r = eng.add_request(Request("r", toks(0, 182), 0, forced_output=[7]))
    assert r.max_new_tokens == 2
    eng.run_until_idle()
    assert r.output == [7]


def test_lone_request_reserve_waiver_does_not_apply_next_to_others():
    # with a request running, a newcomer still leaves its own decode reserve
    eng = make_engine(256, CacheConfig(), SchedulerConfig(init_new_token_ratio=1.0,
                                                          min_new_token_ratio=1.0,
                                                          new_token_ratio_decay=0.0))
    a = eng.add_request(Request("a", toks(0, 100), 0, forced_output=toks(900, 19)))
    eng.step()                                            # a prefilled: reserve 20 - 1 = 19
    assert a.status is Status.RUNNING
    # free 256 - 100 (a's prompt, locked) = 156, minus 19 reserved for a = 137. b's prompt
    # (100) fits that, but not with its own reserve of 50 on top: b waits, a decodes
    b = eng.add_request(Request("b", toks(1000, 100), 0, forced_output=toks(800, 49),
                                arrival=eng.now))
    eng.step()
    assert eng.executor.steps[1] == [("a", 100, 1, True, "decode")]
    assert b.status is Status.WAITING
    eng.run_until_idle()
    assert b.output == toks(800, 49) and b.first_admit >= a.finish_time


def test_one_admission_is_one_pure_read_and_one_splitting_match():
    # admission used to match the same key three or four times (memo, budget check,
    # splitting match, then again when the prompt entered the cache)
    s = make_scheduler(policy="fcfs")
    warm(s, toks(0, 100))
    calls: list[bool] = []
    inner = s.mgr.cache.match_prefix
    s.mgr.cache.match_prefix = lambda key, split=True: (calls.append(split), inner(key, split))[1]
    r = Request("r", toks(0, 100) + toks(500, 20), 0, forced_output=toks(900, 3))
    s.add(r)
    plan = s.schedule(0.0)
    assert [(seg.req.rid, seg.prefix_len, seg.n) for seg in plan.extends] == [("r", 100, 20)]
    assert calls == [False, True]            # the memo's pure read, then the one split
    calls.clear()
    s.process(plan, fake_result(plan), 0.0)  # prefill done: the prompt enters the cache
    assert calls == [] and r.cached_len == 120 and r.status.value == "running"
    s.mgr.check()
