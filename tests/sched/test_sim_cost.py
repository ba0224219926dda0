"""SimExecutor charges exactly CostModel.step_time for the plan it is given, and a prefix hit
makes a prefill step cheaper than recomputing it."""
from __future__ import annotations

import numpy as np
import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sim.costmodel import CostModel
from radixkv.sim.executor import SimExecutor
from radixkv.sched.batch import BatchPlan, Segment
from radixkv.sched.request import FILLER_BASE, Request

from ._helpers import COST, make_engine, toks


def seg(prefix_len: int, n: int, sample: bool = True, scripted: bool = True) -> Segment:
    req = Request(f"r{prefix_len}-{n}", toks(0, prefix_len + n), 1,
                  forced_output=() if scripted else None)
    return Segment(req, prefix_len, toks(prefix_len, n), np.arange(prefix_len + n), sample)


@pytest.mark.parametrize("model, gpu", [("llama-3-8b", "h100-sxm"), ("llama-3-8b", "a100-80g")])
def test_sim_duration_is_step_time_of_the_plan(model, gpu):
    cost = CostModel.named(model, gpu)
    sim = SimExecutor(cost)
    plan = BatchPlan(extends=[seg(1000, 100), seg(0, 300, sample=False)],
                     decodes=[seg(2048, 1), seg(17, 1), seg(0, 1)])
    res = sim.run(plan)
    assert res.duration == cost.step_time([(1000, 100), (0, 300)], [2048, 17, 0])
    assert res.tokens == [None] * 5                       # scripted: nothing sampled
    assert sim.busy_s == res.duration
    # the same number by hand from the roofline: max(compute, memory) + host overhead
    ms = cost.model_spec
    flops = (ms.flops_per_token * 400 + ms.attn_flops_per_ctx_token
             * (100 * 1000 + 100 * 101 // 2 + 300 * 301 // 2)
             + sum(ms.flops_per_token + ms.attn_flops_per_ctx_token * (c + 1) for c in (2048, 17, 0)))
    nbytes = ms.weight_bytes_per_gpu + ms.kv_bytes_per_token_per_gpu * (1000 + 2048 + 17)
    hand = max(flops / (ms.tp * cost.gpu.achieved_flops), nbytes / cost.gpu.achieved_bw_Bps)
    assert res.duration == pytest.approx(hand + cost.step_overhead_s, rel=1e-12)
    assert sim.run(BatchPlan(decodes=[seg(5, 1)])).duration == cost.step_time((), [5])
    assert sim.busy_s == res.duration + cost.step_time((), [5])


def test_unscripted_requests_get_fresh_filler_ids():
    # a trace that records only an output length: the simulated GPU "samples" filler ids,
    # above any vocabulary and never repeated, so they never hit
    sim = SimExecutor(COST)
    res = sim.run(BatchPlan(extends=[seg(0, 8, scripted=False), seg(0, 4, False, False)],
                            decodes=[seg(9, 1, scripted=False), seg(3, 1)]))
    assert res.tokens == [FILLER_BASE, None, FILLER_BASE + 1, None]
    assert sim.run(BatchPlan(decodes=[seg(9, 1, scripted=False)])).tokens == [FILLER_BASE + 2]


def test_cached_prefix_costs_less_than_recomputing_it():
    # (the model charges a hit's KV read but no KV writes, so for tiny memory-bound steps,
    # e.g. (100, 10) vs (0, 110), the hit comes out a hair dearer; real prompts are not there)
    for p, n in [(1000, 100), (4000, 120), (2900, 100), (500, 500)]:
        assert COST.step_time([(p, n)]) < COST.step_time([(0, p + n)])
    # and an empty plan costs nothing
    assert SimExecutor(COST).run(BatchPlan()).duration == 0.0


def test_engine_clock_is_the_sum_of_step_times():
    eng = make_engine(8192, CacheConfig(), SchedulerConfig(chunked_prefill_size=256))
    base = toks(1000, 1500)
    eng.add_request(Request("a", base + toks(5000, 20), 0, forced_output=toks(9000, 5)))
    eng.add_request(Request("b", base + toks(6000, 20), 0, forced_output=toks(9100, 7)))
    eng.run_until_idle()
    now = 0.0
    for step in eng.executor.steps:
        ext = [(s[1], s[2]) for s in step if s[4] == "extend"]
        dec = [s[1] for s in step if s[4] == "decode"]
        now += COST.step_time(ext, dec)
    assert eng.now == now and eng.timeline["t"][-1] == now


def test_warm_turn_prefill_step_is_cheaper_than_cold():
    def first_step_time(warm: bool):
        eng = make_engine(8192, CacheConfig(), SchedulerConfig(chunked_prefill_size=0))
        prompt = toks(1000, 3000)
        if warm:
            eng.add_request(Request("w", prompt[:2900], 0, forced_output=()))
            eng.run_until_idle()
        r = eng.add_request(Request("r", prompt, 0, forced_output=(), arrival=eng.now))
        eng.step()
        (seg,) = eng.executor.steps[-1]
        return r, seg, COST.step_time([(seg[1], seg[2])])

    cold, cold_seg, cold_dt = first_step_time(False)
    warm, warm_seg, warm_dt = first_step_time(True)
    assert (cold.cached_tokens, warm.cached_tokens) == (0, 2900)
    assert cold_seg == ("r", 0, 3000, True, "extend")
    assert warm_seg == ("r", 2900, 100, True, "extend")
    assert warm_dt < cold_dt / 10
