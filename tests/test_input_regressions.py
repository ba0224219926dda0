"""Regression tests: bad input rejected up front, and state left unchanged."""
import math

import numpy as np
import pytest

from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix import RadixCache
from radixkv.config import EngineConfig, SchedulerConfig
from radixkv.engine.engine import Engine
from radixkv.sim.executor import SimExecutor
from radixkv.cache.manager import CacheManager
from radixkv.sched.admission import AddResult, PrefillAdder
from radixkv.sched.policy import OrderContext, dfs_weight
from radixkv.sched.request import Request


@pytest.mark.parametrize("arrival", [math.nan, math.inf, -1.0, "0"])
def test_regression_request_arrival_must_be_finite(arrival):
    # a NaN arrival never compared <= now: the engine loop spun forever
    with pytest.raises(ValueError, match="arrival must be a finite time"):
        Request("r", [1, 2, 3], 4, arrival=arrival)


@pytest.mark.parametrize("kw, msg", [({"priority": "high"}, "priority must be an int"),
                                     ({"priority": True}, "priority must be an int"),
                                     ({"forced_output": [5, 2**33]}, "out of range"),
                                     ({"forced_output": [5, -1]}, "out of range"),
                                     ({"forced_output": [5, 2.5]}, "not an int")])
def test_regression_request_fields_validated_before_admission(kw, msg):
    # these used to pass the constructor and crash mid-step with slots and locks still held
    with pytest.raises(ValueError, match=msg):
        Request("r", [1, 2, 3], 4, **kw)


def test_regression_memo_and_dfs_weight_after_cache_reset():
    cache = RadixCache(clock=iter(range(10**6)).__next__)
    cache.insert(RadixKey([1, 2, 3, 4]), np.arange(4))          # a node ends at 4 tokens
    reqs = [Request(f"r{i}", [1, 2, 3, 4, 9 + i], 2, index=i) for i in range(3)]
    ctx = OrderContext(CacheManager(cache, SlotPool(64)), [])
    assert [ctx.prefix(r)[0] for r in reqs] == [4, 4, 4]
    cache.reset()
    assert [ctx.prefix(r)[0] for r in reqs] == [0, 0, 0]        # not the old tree's answer
    assert [r.rid for r in dfs_weight(reqs, ctx)] == ["r0", "r1", "r2"]


def test_regression_memory_refusal_does_not_bump_hit_counts():
    cache, pool = RadixCache(clock=iter(range(10**6)).__next__), SlotPool(64)
    s = pool.alloc(8)
    cache.insert(RadixKey(list(range(8))), s)
    node = cache.match_prefix(RadixKey(list(range(8))), split=False).last_node
    hits, last = node.hit_count, node.last_access
    req = Request("big", list(range(8)) + list(range(100, 150)), 8)
    for _ in range(5):                                           # refused every round
        adder = PrefillAdder(CacheManager(cache, pool), 4096, True, reserved=40,
                             new_token_ratio=1.0)
        assert adder.add(req) is AddResult.NO_MEMORY
    assert (node.hit_count, node.last_access) == (hits, last)
    cache.check_invariants()


@pytest.mark.parametrize("build, msg", [
    (lambda: RadixCache(hash_algo="md5", enable_events=True), "unknown hash 'md5'"),
    (lambda: RadixCache(eviction_policy="belady", oracle=None), "needs an oracle")])
def test_regression_bad_cache_options_rejected_at_construction(build, msg):
    # both used to construct, then corrupt the tree on the first insert
    with pytest.raises(ValueError, match=msg):
        build()


def test_regression_blockhash_insert_rejects_a_block_listed_twice():
    c = BlockHashCache(block_size=2)
    with pytest.raises(ValueError, match="block 0 twice"):
        c.insert(RadixKey([1, 2, 3, 4]), [0, 1, 0, 1])
    assert c.num_blocks() == 0 and c.total_size() == 0
    c.check_invariants()


def test_regression_executor_token_count_mismatch_raises():
    cfg = EngineConfig(kv_capacity=256, sched=SchedulerConfig())
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())
    eng.add_request(Request("r", list(range(10)), 2))
    run = eng.executor.run
    eng.executor.run = lambda plan: run(plan)._replace(tokens=[])   # a broken executor
    with pytest.raises(ValueError):
        eng.step()
