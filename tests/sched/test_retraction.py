"""Retraction: when decode runs out of slots a running request is released and re-queued; it
finishes later with exactly its scripted output, paying a recomputation. With retract_insert
its computed KV enters the tree first, so its re-admission hits it."""
from __future__ import annotations

import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sched.request import Request, Status
from radixkv.workloads import make_workload

from ._helpers import make_engine, requests_of, toks

TIGHT = dict(policy="lpm", max_prefill_tokens=256, chunked_prefill_size=64,
             max_running_requests=16, init_new_token_ratio=0.05, min_new_token_ratio=0.0)


@pytest.fixture(scope="module")
def support():
    return make_workload("support", num_users=8, turns=3, system_len=64, fewshot_len=96,
                         rag_len=128, msg_len=(8, 32), reply_len=(10, 60), think_time=0.05,
                         rate=100.0, seed=1)


@pytest.mark.parametrize("retract_policy", ["most-remaining", "least-progress", "newest"])
@pytest.mark.parametrize("retract_insert", [False, True])
def test_retraction_heavy_run_finishes_every_script(support, retract_policy, retract_insert):
    sched = SchedulerConfig(retract_policy=retract_policy, retract_insert=retract_insert, **TIGHT)
    eng = make_engine(400, CacheConfig(), sched, check=True)
    reqs = [eng.add_request(r) for r in requests_of(support)]
    rep = eng.run_until_idle()
    assert rep.retractions > 0
    assert rep.retractions == sum(r.retractions for r in reqs)
    for r in reqs:
        assert r.status is Status.FINISHED
        assert r.output == list(r.forced_output)
        # a retracted request recomputes something; the others never do
        assert (r.recomputed_tokens > 0) == (r.retractions > 0), r
        # the first admission computes the uncached prompt, re-admissions are recomputation
        assert r.prefill_tokens == r.prompt_len - r.cached_tokens + r.recomputed_tokens
    eng.pool.check_conservation(list(eng.cache.held_slots()))
    assert eng.pool.used() == eng.cache.total_size() and eng.cache.protected_size() == 0


def _running_after(eng, req, decodes: int):
    while req.status is not Status.RUNNING:
        eng.step()
    for _ in range(decodes):
        eng.step()
    return req


@pytest.mark.parametrize("retract_insert, hit", [(True, 55), (False, 50)])
def test_retracted_request_readmission_hits(retract_insert, hit):
    eng = make_engine(4096, CacheConfig(), SchedulerConfig(retract_insert=retract_insert),
                      check=True)
    r = eng.add_request(Request("r", toks(1000, 50), 0, forced_output=toks(2000, 20)))
    _running_after(eng, r, 5)
    # prefill sampled out[0]; 5 decodes computed the KV of out[0..4] and sampled out[1..5]
    assert (r.num_computed, len(r.output)) == (55, 6)
    eng.sched.retract(r)
    eng.check_invariants()
    assert r.status is Status.WAITING and r.retractions == 1
    assert r.slots.size == 0 and r.last_node is None
    eng.step()
    # retract_insert: all 55 computed tokens were cached; else only the prompt (inserted when
    # its prefill completed) is, and the 5 decoded tokens are recomputed
    assert eng.executor.steps[-1] == [("r", hit, 56 - hit, True, "extend")]
    assert r.recomputed_tokens == 56 - hit
    assert r.cached_tokens == 0                          # first-admission hit, unchanged
    eng.run_until_idle()
    assert r.output == toks(2000, 20)
    assert r.prefill_tokens == 50 + 56 - hit


def test_retract_insert_with_pages_hits_whole_pages():
    eng = make_engine(4096, CacheConfig("radix", 4), SchedulerConfig(retract_insert=True),
                      check=True)
    r = eng.add_request(Request("r", toks(1000, 50), 0, forced_output=toks(2000, 20)))
    _running_after(eng, r, 5)
    eng.sched.retract(r)
    eng.check_invariants()
    eng.step()
    assert eng.executor.steps[-1] == [("r", 52, 4, True, "extend")]     # 55 -> 13 pages
    eng.run_until_idle()
    assert r.output == toks(2000, 20)


def test_regression_decode_retracting_everything_is_not_a_stuck_queue():
    """A chunked request waiting for memory while the only running request needs a decode
    slot: the decode phase retracted the running request and the round formed no step, so
    schedule() returned None, which the engine reads as a stuck queue (RuntimeError "requests
    never finished"). The retraction freed memory: the chunk goes on in the same round."""
    sched = SchedulerConfig(chunked_prefill_size=8, init_new_token_ratio=0.0,
                            min_new_token_ratio=0.0)
    eng = make_engine(56, CacheConfig(evict_granularity="node"), sched, check=True)
    a = eng.add_request(Request("a", toks(100, 8), 0, forced_output=toks(200, 40), index=0))
    b = eng.add_request(Request("b", toks(300, 50), 0, forced_output=toks(400, 1), index=1))
    eng.run_until_idle()
    assert a.output == toks(200, 40) and b.output == toks(400, 1)
    assert a.retractions >= 1
    # rounds 1-6 prefilled a (8) and then b's chunks (6 x 8 = 48 of 50); in round 7 b's last
    # chunk found no memory and a's decode none either: a was retracted (its prompt evicted
    # for b) and, in the same round, b's last chunk ran next to a's re-admission
    assert eng.executor.steps[0] == [("a", 0, 8, True, "extend")]
    assert [s[0][1:3] for s in eng.executor.steps[1:7]] == [(8 * j, 8) for j in range(6)]
    assert eng.executor.steps[7] == [("b", 48, 2, True, "extend"), ("a", 0, 6, False, "extend")]


@pytest.mark.parametrize("retract_insert", [False, True])
def test_regression_retracting_a_request_that_is_not_running_changes_nothing(retract_insert):
    """Scheduler.retract on the chunked (or a waiting) request released its slots and only
    then failed in running.remove: the chunked request kept going with no slots or lock."""
    eng = make_engine(4096, CacheConfig(), SchedulerConfig(chunked_prefill_size=16,
                                                           retract_insert=retract_insert),
                      check=True)
    r = eng.add_request(Request("r", toks(0, 40), 0, forced_output=toks(900, 3)))
    w = eng.add_request(Request("w", toks(100, 40), 0, forced_output=(), arrival=0.5))
    eng.step()
    assert eng.sched.chunked is r and r.num_computed == 16
    before = (r.slots.tolist(), r.cached_len, r.last_node, eng.pool.available())
    with pytest.raises(ValueError, match="only a running request can be retracted"):
        eng.sched.retract(r)
    assert (r.slots.tolist(), r.cached_len, r.last_node, eng.pool.available()) == before
    eng.check_invariants()
    eng.run_until_idle()
    with pytest.raises(ValueError, match="only a running request"):
        eng.sched.retract(w)                              # finished
    assert r.output == toks(900, 3) and r.retractions == 0
