"""Cost model and specs: hand-computed tiny cases, monotonicity, TP scaling, named specs."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from radixkv.sim.costmodel import DEFAULT_STEP_OVERHEAD_S, CostModel
from radixkv.shapes import ModelArgs, get_model_config
from radixkv.sim.specs import (GPU_SPECS, MODEL_SPECS, GPUSpec, ModelSpec,
                                  get_gpu, get_model_spec, kv_capacity_tokens)

# Toy shape: dim 8, 2 layers, 2 heads of head_dim 4, 1 KV head, MLP 16, vocab 10.
TOY = ModelArgs("toy", vocab_size=10, dim=8, n_layers=2, n_heads=2, n_kv_heads=1,
                intermediate_size=16)
# Per layer: wq 8*8 + wo 8*8 + wk 8*4 + wv 8*4 = 192; MLP 3*8*16 = 384; two norms 16 -> 592.
# All params: 2*592 + embedding 80 + LM head 80 + final norm 8 = 1352; non-embedding 1272.
TOY_PARAMS = 2 * (8 * 8 + 8 * 8 + 8 * 4 + 8 * 4 + 3 * 8 * 16 + 2 * 8) + 10 * 8 * 2 + 8
TOY_P = TOY_PARAMS - 10 * 8
TOY_A = 4 * 2 * 2 * 4            # 4 * layers * heads * head_dim = 64 FLOPs per attended pair
TOY_W = TOY_PARAMS * 2           # bf16 weights: 2704 bytes
TOY_K = 2 * 2 * 1 * 4 * 2        # K,V * layers * kv_heads * head_dim * 2 bytes = 32 bytes/token

# Compute-bound toy GPU: 1e6 FLOP/s, 1e9 B/s. Memory-bound toy GPU: 1e12 FLOP/s, 5e8 B/s.
SLOW_FLOPS = GPUSpec("slow-flops", peak_bf16_tflops=1e-6, achieved_tflops=1e-6,
                     hbm_bytes=10**9, hbm_bandwidth_Bps=1e9, achieved_bw_fraction=1.0)
SLOW_MEM = GPUSpec("slow-mem", peak_bf16_tflops=2.0, achieved_tflops=1.0,
                   hbm_bytes=10**9, hbm_bandwidth_Bps=1e9, achieved_bw_fraction=0.5)


def toy(gpu: GPUSpec, tp: int = 1, overhead: float = 0.0) -> CostModel:
    return CostModel(ModelSpec(TOY, tp=tp), gpu, step_overhead_s=overhead)


def test_toy_shape_hand_counts():
    assert TOY_P == 1272 and TOY_W == 2704
    ms = ModelSpec(TOY)
    assert ms.flops_per_token == 2 * 1272
    assert ms.attn_flops_per_ctx_token == 64
    assert ms.weight_bytes_per_gpu == 2704 and ms.kv_bytes_per_token_per_gpu == 32


def test_prefill_flops_by_hand():
    cm = toy(SLOW_FLOPS)
    # Segment (3, 2): positions 3 and 4 attend 4 and 5 tokens -> 9 pairs.
    assert cm.prefill_flops([(3, 2)]) == 2 * 1272 * 2 + 64 * (4 + 5)          # 5664
    # Segment (0, 3) attends 1 + 2 + 3 = 6 pairs; two segments add up.
    assert cm.prefill_flops([(0, 3)]) == 2 * 1272 * 3 + 64 * 6               # 8016
    assert cm.prefill_flops([(3, 2), (0, 3)]) == 5664 + 8016


def test_prefill_time_compute_bound_by_hand():
    cm = toy(SLOW_FLOPS)
    # 5664 FLOPs at 1e6 FLOP/s = 5.664 ms; bytes 2704 + 32*3 read + 32*2 written = 2864
    # at 1e9 B/s = 2.9 us.
    assert cm.bytes_per_gpu([(3, 2)]) == 2864
    assert cm.prefill_time([(3, 2)]) == pytest.approx(5664 / 1e6)


def test_prefill_time_memory_bound_by_hand():
    cm = toy(SLOW_MEM)
    # 5664 FLOPs at 1e12 FLOP/s = 5.7 ns; 2864 bytes at 0.5 * 1e9 B/s = 5.7 us.
    assert cm.prefill_time([(3, 2)]) == pytest.approx(2864 / 5e8)


def test_decode_by_hand():
    cm = toy(SLOW_FLOPS)
    # Requests with 3 and 0 cached tokens: FLOPs 2*1272 each + 64*(3+1) + 64*(0+1).
    flops = 2 * 2 * 1272 + 64 * 4 + 64 * 1
    assert cm.decode_flops([3, 0]) == flops == 5408
    assert cm.decode_time([3, 0]) == pytest.approx(flops / 1e6)
    # Memory-bound: weights + 3 tokens of KV read + 2 new tokens' KV written at 5e8 B/s.
    assert toy(SLOW_MEM).decode_time([3, 0]) == pytest.approx((2704 + 96 + 64) / 5e8)
    # A decode request is the prefill segment (c, 1).
    assert cm.decode_flops([7]) == cm.prefill_flops([(7, 1)])


def test_step_time_mixed_by_hand():
    cm = toy(SLOW_MEM, overhead=1e-3)
    # One weights read for both: 2704 + 32 * (3 prefix + 5 context) bytes read, 32 * (2 + 1)
    # new tokens written, plus 1 ms.
    assert cm.step_time([(3, 2)], [5]) == pytest.approx((2704 + 32 * 8 + 32 * 3) / 5e8 + 1e-3)
    # Sharing the weights read makes a mixed step cheaper than two steps.
    assert cm.step_time([(3, 2)], [5]) < cm.step_time([(3, 2)]) + cm.step_time((), [5])
    assert toy(SLOW_FLOPS).step_time([(3, 2)], [0]) == pytest.approx((5664 + 2 * 1272 + 64) / 1e6)
    assert cm.step_time() == 0.0 and cm.prefill_time([]) == 0.0 and cm.decode_time([]) == 0.0


def test_step_overhead_added_once():
    cm = CostModel.named("llama-3-8b", "h100-sxm")
    assert cm.step_overhead_s == DEFAULT_STEP_OVERHEAD_S
    segs = [(0, 512), (100, 300)]
    assert cm.step_time(segs) - cm.prefill_time(segs) == pytest.approx(DEFAULT_STEP_OVERHEAD_S)


def test_cached_prefix_is_cheaper_than_recompute():
    cm = CostModel.named("llama-3-8b", "h100-sxm")
    hit = cm.prefill_time([(3000, 1000)])
    assert hit < cm.prefill_time([(0, 4000)]) / 3
    # ...but attending to a longer context costs more than the same new tokens alone.
    assert cm.prefill_time([(0, 1000)]) < hit
    times = [cm.prefill_time([(p, 4096 - p)]) for p in range(0, 4096, 512)]
    assert times == sorted(times, reverse=True)


def test_prefill_time_grows_with_tokens():
    cm = CostModel.named("qwen2-7b", "a100-80g")
    times = [cm.prefill_time([(0, n)]) for n in (1, 64, 1024, 4096, 16384)]
    assert times == sorted(times)
    # Short prefills sit on the weights-read floor; long ones are compute-bound and grow.
    spec = get_model_spec("qwen2-7b")
    w, k = spec.weight_bytes_per_gpu, spec.kv_bytes_per_token_per_gpu
    assert times[0] == pytest.approx((w + k) / (0.8 * 2.039e12))
    assert times[1] == pytest.approx((w + 64 * k) / (0.8 * 2.039e12))
    assert times[1] < times[2] < times[3] < times[4]


def test_tp_scaling():
    m70 = get_model_config("llama-3-70b")
    tp4, tp8 = ModelSpec(m70, tp=4), ModelSpec(m70, tp=8)
    assert tp4.weight_bytes_per_gpu == math.ceil(70553706496 * 2 / 4)
    assert tp8.weight_bytes_per_gpu == 70553706496 * 2 // 8
    assert tp4.kv_bytes_per_token_per_gpu == 2 * 80 * 2 * 128 * 2       # 2 KV heads per GPU
    assert tp8.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2       # 1 KV head per GPU
    h100 = get_gpu("h100-sxm")
    c4, c8 = CostModel(tp4, h100), CostModel(tp8, h100)
    # Compute-bound prefill: same total FLOPs, twice the GPUs -> half the time (all-reduce
    # apart, which tests/sim/test_costmodel_tp.py prices by hand).
    assert c4.prefill_flops([(0, 8192)]) == c8.prefill_flops([(0, 8192)])
    gemm = lambda c, segs, ctxs: c.step_time(segs, ctxs) - c.allreduce_time(  # noqa: E731
        sum(n for _, n in segs) + len(ctxs))
    assert gemm(c8, [(0, 8192)], []) - 3e-3 == pytest.approx((gemm(c4, [(0, 8192)], []) - 3e-3) / 2)
    # Bandwidth-bound decode: half the bytes per GPU -> half the time.
    assert gemm(c8, [], [2000]) - 3e-3 == pytest.approx((gemm(c4, [], [2000]) - 3e-3) / 2)
    # tp beyond n_kv_heads replicates KV heads: toy has 1 KV head, tp 2 keeps 32 B/token.
    assert ModelSpec(TOY, tp=2).kv_bytes_per_token_per_gpu == 32
    # plus 2 layers x 2 all-reduces of 2 tokens x 8 dims x 2 B over the default 450e9 B/s link,
    # 2 * (tp - 1) = 2 ring steps of 5 us each
    ar = 2 * 2 * (2 * 1 / 2 * 2 * 8 * 2 / 450e9 + 2 * 1 * 5e-6)
    assert toy(SLOW_FLOPS, tp=2).prefill_time([(3, 2)]) == pytest.approx(5664 / 2 / 1e6 + ar)


def test_decode_is_bandwidth_bound_on_h100():
    cm = CostModel.named("llama-3-8b", "h100-sxm")
    # Batch 1, 1000 cached: (16,060,522,496 weight B + 131,072 * 1000 KV B) / (0.8 * 3.35e12).
    # The new token's K and V (131,072 B) are written too.
    expected = (8030261248 * 2 + 131072 * 1000 + 131072) / (0.8 * 3.35e12)
    assert cm.decode_time([1000]) == pytest.approx(expected)
    assert cm.decode_time([1000]) > cm.decode_flops([1000]) / 400e12 * 100
    # Batch 64 costs far less than 64 single steps (the weights are read once).
    assert cm.decode_time([1000] * 64) < 2 * cm.decode_time([1000])
    # A huge batch eventually turns compute-bound.
    big = [0] * 20000
    assert cm.decode_time(big) == pytest.approx(cm.decode_flops(big) / 400e12)


@pytest.mark.parametrize("prompt_len", [2048, 4096, 8192])
def test_llama3_8b_h100_prefill_rate_near_reference(prompt_len):
    # Reference: ~22,000 tok/s prefill for Llama-3-8B on one H100 at ~400 TFLOP/s achieved.
    cm = CostModel.named("llama-3-8b", "h100-sxm")
    rate = cm.prefill_tokens_per_s(prompt_len)
    assert 22000 * 0.85 <= rate <= 22000 * 1.15
    assert rate == pytest.approx(prompt_len / cm.step_time([(0, prompt_len)]))


def test_kv_capacity_by_hand():
    ms, h100 = get_model_spec("llama-3-8b"), get_gpu("h100-sxm")
    assert kv_capacity_tokens(ms, h100) == (72 * 10**9 - 16060522496) // 131072   # 426784
    assert kv_capacity_tokens(ms, get_gpu("h200")) > 2 * kv_capacity_tokens(ms, h100) * 0.95
    with pytest.raises(ValueError, match="do not fit"):
        kv_capacity_tokens(ModelSpec(get_model_config("llama-3-70b")), h100)
    with pytest.raises(ValueError, match="mem_fraction"):
        kv_capacity_tokens(ms, h100, mem_fraction=0)


def test_named_specs():
    assert set(GPU_SPECS) >= {"h100-sxm", "h200", "a100-80g", "l40s"}
    assert set(MODEL_SPECS) >= {"llama-3-8b", "llama-3-70b", "llama-3-70b-tp8", "qwen2-7b"}
    assert get_model_spec("llama-3-70b").tp == 4 and get_model_spec("llama-3-70b-tp8").tp == 8
    assert get_model_spec("llama-3-70b-tp8").name == "llama-3-70b-tp8"
    h100, h200 = get_gpu("h100-sxm"), get_gpu("h200")
    assert h100.peak_bf16_tflops == h200.peak_bf16_tflops == 989.0
    assert h200.hbm_bandwidth_Bps / h100.hbm_bandwidth_Bps == pytest.approx(4.8 / 3.35)
    for g in GPU_SPECS.values():
        assert 0 < g.mfu <= 1
    with pytest.raises(ValueError, match="h100-sxm"):
        get_gpu("h100")
    with pytest.raises(ValueError, match="llama-3-70b-tp8"):
        get_model_spec("llama-3-405b")


@pytest.mark.parametrize("kw, match", [
    (dict(peak_bf16_tflops=0), "peak_bf16_tflops"),
    (dict(achieved_tflops=-1.0), "achieved_tflops"),
    (dict(achieved_tflops=2000.0), "exceeds"),
    (dict(hbm_bytes=0), "hbm_bytes"),
    (dict(hbm_bandwidth_Bps=float("nan")), "hbm_bandwidth_Bps"),
    (dict(achieved_bw_fraction=1.5), "achieved_bw_fraction"),
    (dict(name=""), "name"),
])
def test_gpu_spec_validation(kw, match):
    base = dict(name="g", peak_bf16_tflops=989.0, achieved_tflops=400.0, hbm_bytes=80 * 10**9,
                hbm_bandwidth_Bps=3.35e12)
    with pytest.raises(ValueError, match=match):
        GPUSpec(**(base | kw))


def test_model_spec_and_cost_model_validation():
    m8 = get_model_config("llama-3-8b")
    with pytest.raises(ValueError, match="tp 3"):
        ModelSpec(m8, tp=3)
    with pytest.raises(ValueError, match="tp must be"):
        ModelSpec(m8, tp=0)
    with pytest.raises(ValueError, match="dtype_bytes"):
        ModelSpec(m8, dtype_bytes=3)
    with pytest.raises(ValueError, match="step_overhead_s"):
        CostModel(ModelSpec(m8), get_gpu("l40s"), step_overhead_s=-1e-3)
    cm = CostModel(ModelSpec(m8), get_gpu("l40s"))
    with pytest.raises(ValueError, match="new_len"):
        cm.prefill_time([(5, 0)])
    with pytest.raises(ValueError, match="prefix_len"):
        cm.prefill_time([(-1, 4)])
    with pytest.raises(ValueError, match="context_len"):
        cm.decode_time([-2])
    with pytest.raises(ValueError, match="batch_size"):
        cm.decode_tokens_per_s(0, 100)


@settings(max_examples=200, deadline=None)
@given(segs=st.lists(st.tuples(st.integers(0, 70_000), st.integers(1, 9_000)), max_size=5),
       ctxs=st.lists(st.integers(0, 130_000), max_size=40),
       model=st.sampled_from(["llama-3-8b", "llama-3-70b"]), gpu=st.sampled_from(["h100-sxm", "a100-80g"]))
def test_step_time_is_the_roofline_of_its_parts_to_the_bit(segs, ctxs, model, gpu):
    """step_time sums FLOPs and bytes in one pass; it must equal, as a float, the device time
    of prefill_flops + decode_flops and bytes_per_gpu plus the overhead."""
    if not segs and not ctxs:
        return
    c = CostModel.named(model, gpu)
    tokens = sum(n for _, n in segs) + len(ctxs)
    want = c._device_time(c.prefill_flops(segs) + c.decode_flops(ctxs),
                          c.bytes_per_gpu(segs, ctxs), tokens) + c.step_overhead_s
    assert c.step_time(segs, ctxs) == want
