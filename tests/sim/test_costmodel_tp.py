"""KV writes and tensor parallelism in the analytic cost model, by hand with literal numbers."""
from __future__ import annotations

import pytest

from radixkv.shapes import ModelArgs
from radixkv.sim.costmodel import CostModel
from radixkv.sim.specs import GPUSpec, ModelSpec, get_gpu

# dim 8, 2 layers, 4 heads of 2, 2 KV heads, MLP 16, vocab 10 (params: 2 * (8*2*(4*2+2*2) + 384
# + 16) + 160 + 8 = 1352; non-embedding 1272).
TOY = ModelArgs("toy4", vocab_size=10, dim=8, n_layers=2, n_heads=4, n_kv_heads=2,
                intermediate_size=16)
# 1e6 FLOP/s, 1e9 B/s HBM; link 1e6 B/s one way, 1 ms per ring step.
GPU = GPUSpec("toy-gpu", peak_bf16_tflops=1e-6, achieved_tflops=1e-6, hbm_bytes=10**9,
              hbm_bandwidth_Bps=1e9, achieved_bw_fraction=1.0, link_bw_Bps=1e6,
              link_latency_s=1e-3)


def test_toy_counts():
    assert TOY.num_params == 1352 and TOY.num_nonembed_params == 1272
    assert ModelSpec(TOY, tp=2).kv_bytes_per_token_per_gpu == 2 * 2 * 1 * 2 * 2     # 16 B


def test_kv_write_bytes_by_hand():
    cm = CostModel(ModelSpec(TOY), GPU, step_overhead_s=0.0)
    # weights 2704 B; KV 32 B/token: 3 prefix tokens read, 2 new written; 2 decodes of 5 and 0
    # read 5, write 2.
    assert cm.bytes_per_gpu([(3, 2)], [5, 0]) == 2704 + 32 * (3 + 5) + 32 * (2 + 2)


def test_allreduce_by_hand():
    cm = CostModel(ModelSpec(TOY, tp=2), GPU, step_overhead_s=0.0)
    # 3 tokens x dim 8 x 2 B = 48 B per all-reduce; ring: 2*(2-1)/2 * 48 / 1e6 s + 2*1 * 1 ms;
    # two per layer, 2 layers.
    assert cm.allreduce_time(3) == pytest.approx(4 * (48 / 1e6 + 2e-3))          # 8.192 ms
    assert CostModel(ModelSpec(TOY), GPU).allreduce_time(3) == 0.0
    tp4 = CostModel(ModelSpec(TOY, tp=4), GPU)
    assert tp4.allreduce_time(1) == pytest.approx(4 * (2 * 3 / 4 * 16 / 1e6 + 6e-3))


def test_tp_step_time_by_hand():
    cm = CostModel(ModelSpec(TOY, tp=2), GPU, step_overhead_s=1e-3)
    # Prefill (0, 3): FLOPs 2*1272*3 + 4*2*4*2*(1+2+3) = 7632 + 384 = 8016, split over 2 GPUs
    # at 1e6 FLOP/s = 4.008 ms; bytes per GPU 1352 + 16*3 = 1400 at 1e9 -> 1.4 us (compute
    # bound); + all-reduce of 3 tokens 8.192 ms + 1 ms overhead.
    assert cm.bytes_per_gpu([(0, 3)]) == 1400
    expected = 8016 / 2 / 1e6 + 4 * (48 / 1e6 + 2e-3) + 1e-3
    assert cm.step_time([(0, 3)]) == pytest.approx(expected)
    assert cm.prefill_time([(0, 3)]) == pytest.approx(expected - 1e-3)


def test_named_tp_override_and_links():
    cm = CostModel.named("llama-3-8b", "h100-sxm", tp=2)
    assert cm.model_spec.tp == 2 and cm.model_spec.name == "llama-3-8b-tp2"
    # Llama-3-8B, 512 tokens: 4096 * 2 B each; NVLink 450e9 B/s, 5 us per ring step, 64 ARs.
    assert cm.allreduce_time(512) == pytest.approx(64 * (512 * 8192 / 450e9 + 2 * 5e-6))
    assert get_gpu("l40s").link_bw_Bps == 32e9 and get_gpu("a100-80g").link_bw_Bps == 300e9
    with pytest.raises(ValueError, match="tp 3"):
        CostModel.named("llama-3-8b", "h100-sxm", tp=3)
    with pytest.raises(ValueError, match="link_latency_s"):
        GPUSpec("g", 1.0, 1.0, 1, 1.0, link_latency_s=-1.0)
