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


def test_regression_output_len_only_records_are_simulated_with_filler():
    # simulate / compare refused a JSONL request with output_len and no output ("not scripted
    # and the executor sampled nothing"), though the reader and replay accept it
    from radixkv.config import EngineConfig
    from radixkv.engine.engine import Engine, request_from_trace
    from radixkv.sched.request import FILLER_BASE
    from radixkv.sim.executor import SimExecutor
    from radixkv.workloads import TraceRequest
    trs = [TraceRequest("a", 0.0, tuple(range(40)), output_len=5),
           TraceRequest("b", 0.1, tuple(range(40)) + (7, 8), output_len=0),
           TraceRequest("c", 0.2, tuple(range(40)) + (9,), output=(1, 2, 3))]
    cfg = EngineConfig(kv_capacity=512)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())
    for i, tr in enumerate(trs):
        eng.add_request(request_from_trace(tr, i))
    rep = eng.run_until_idle()
    out = {r.rid: r.output for r in eng.finished}
    assert len(out["a"]) == 5 and all(t >= FILLER_BASE for t in out["a"])
    assert len(set(out["a"])) == 5                       # never repeated: filler never hits
    assert out["b"] == [] and out["c"] == [1, 2, 3]
    assert [r.cached_tokens for r in sorted(rep.records, key=lambda r: r.rid)] == [0, 40, 40]
    eng.check_invariants()


def test_regression_equal_arrivals_after_forget_finished_do_not_compare_requests():
    """The arrival heap broke ties by len(requests), which forget_finished shrinks: a new
    request could get the tie-break of one still pending at the same time, and the heap then
    compared Request objects (TypeError)."""
    from radixkv.config import CacheConfig, EngineConfig
    from radixkv.engine.engine import Engine
    from radixkv.sched.request import Request, Status
    from radixkv.sim.executor import SimExecutor
    eng = Engine(EngineConfig(kv_capacity=4096, cache=CacheConfig()), CacheConfig().build(),
                 SimExecutor.named())
    b = eng.add_request(Request("b", list(range(10)), 2))
    eng.add_request(Request("c", list(range(20, 30)), 2, arrival=100.0))
    while b.status is not Status.FINISHED:
        eng.step()
    eng.forget_finished()                            # requests: [c], pending at t=100
    eng.add_request(Request("d", list(range(40, 50)), 2, arrival=100.0))
    rep = eng.run_until_idle()
    assert sorted(r.rid for r in rep.records) == ["c", "d"]
