"""Regression tests for engine-loop bugs."""
import pytest

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.engine.engine import Engine
from radixkv.sim.executor import SimExecutor
from radixkv.sched.request import Request


def test_regression_chunk_smaller_than_page_is_rejected():
    # a chunk budget below the page size rounded every chunk down to 0 tokens: the request
    # was never admitted and run_until_idle spun forever
    with pytest.raises(ValueError, match="smaller than the page size 16"):
        EngineConfig(cache=CacheConfig(page_size=16), sched=SchedulerConfig(chunked_prefill_size=8))


def test_regression_stuck_queue_raises_instead_of_spinning():
    cfg = EngineConfig(kv_capacity=1024)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())
    eng.add_request(Request("r0", list(range(40)), 4))
    eng.sched.schedule = lambda now: None          # nothing can ever be scheduled
    with pytest.raises(RuntimeError, match="1 requests never finished"):
        eng.run_until_idle()
    assert eng.steps == 0
