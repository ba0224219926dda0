"""Hardware and serving specs for the cost model (no torch here).

`GPUSpec` is one accelerator: datasheet peaks plus the sustained rates the cost model uses.
`ModelSpec` is a model shape served at a tensor-parallel degree and a
dtype; its properties give the per-GPU figures the cost model needs. Units: bytes, FLOPs,
seconds; "GB" and "TB/s" below are decimal (1e9, 1e12), as on the datasheets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from radixkv.shapes import ModelArgs, get_model_config
from radixkv.argcheck import (finite_at_least, positive_fraction, positive_int,
                              positive_number)


@dataclass(frozen=True)
class GPUSpec:
    name: str
    peak_bf16_tflops: float       # dense (no 2:4 sparsity) bf16 tensor-core peak, TFLOP/s
    achieved_tflops: float        # sustained rate for a whole forward pass, used by the model
    hbm_bytes: int                # device memory, bytes
    hbm_bandwidth_Bps: float      # peak memory bandwidth, bytes/s
    achieved_bw_fraction: float = 0.8   # share of peak bandwidth a streaming kernel sustains
    link_bw_Bps: float = 450e9    # GPU-to-GPU bandwidth of the TP group, one direction, bytes/s
    link_latency_s: float = 5e-6  # one step of a ring all-reduce (launch, sync, hop), seconds

    def __post_init__(self):
        if not self.name:
            raise ValueError("GPUSpec.name must be non-empty")
        for f in ("peak_bf16_tflops", "achieved_tflops", "hbm_bytes", "hbm_bandwidth_Bps",
                  "link_bw_Bps"):
            positive_number(getattr(self, f), f"GPUSpec.{f}")
        finite_at_least(self.link_latency_s, "GPUSpec.link_latency_s", 0)
        positive_fraction(self.achieved_bw_fraction, "GPUSpec.achieved_bw_fraction")
        if self.achieved_tflops > self.peak_bf16_tflops:
            raise ValueError(f"GPUSpec.achieved_tflops {self.achieved_tflops!r} exceeds "
                             f"peak_bf16_tflops {self.peak_bf16_tflops!r}")

    @cached_property
    def achieved_flops(self) -> float:
        """Sustained FLOP/s of one GPU."""
        return self.achieved_tflops * 1e12

    @cached_property
    def achieved_bw_Bps(self) -> float:
        """Sustained bytes/s of one GPU."""
        return self.hbm_bandwidth_Bps * self.achieved_bw_fraction

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation implied by achieved_tflops."""
        return self.achieved_tflops / self.peak_bf16_tflops


# Sources (NVIDIA datasheets; bf16 figures there are quoted "with sparsity", dense = half):
#   H100 SXM5: "NVIDIA H100 Tensor Core GPU" datasheet — BF16 1,979 TFLOPS sparse -> 989 dense,
#              80 GB HBM3, 3.35 TB/s.
#   H200 SXM:  "NVIDIA H200 Tensor Core GPU" datasheet — same 1,979 sparse -> 989 dense,
#              141 GB HBM3e, 4.8 TB/s.
#   A100 80GB SXM: "NVIDIA A100 Tensor Core GPU" datasheet — BF16 312 dense (624 sparse),
#              80 GB HBM2e, 2,039 GB/s.
#   L40S:      "NVIDIA L40S GPU" datasheet — BF16 362.05 dense (733 sparse), 48 GB GDDR6,
#              864 GB/s.
# Usable memory as nvidia-smi reports it is slightly above these decimal figures (H100: 81,559
# MiB), so with mem_fraction < 1 the capacity estimate errs on the small side.
#
# Achieved rates (assumptions, not measurements): large bf16 GEMMs alone reach ~60-75% of peak
# on Hopper, but a full prefill forward also runs attention, norms, RoPE, SwiGLU, sampling and
# launches that do little matmul work, so end-to-end model-FLOPs utilisation of serving engines
# is ~40% on H100 (400 of 989); at 400 the cost model gives 23-25k tok/s prefill for Llama-3-8B
# on one H100 (1k-8k prompts), near the ~22k tok/s reference figure. H200 has the same SMs
# and clocks, so the same 400. A100 kernels are more mature relative to peak (~60%: 190 of
# 312). L40S is power-limited (350 W) and drops clocks under sustained tensor load, ~50% (180
# of 362). Bandwidth: streaming kernels (weights and KV
# reads in decode) sustain ~80% of peak HBM bandwidth on all four.
#
# Interconnect of a TP group (link_bw_Bps: one direction, per GPU):
#   H100 SXM5 / H200 SXM: fourth-generation NVLink, 900 GB/s per GPU "bidirectional" on both
#              datasheets -> 450 GB/s each way.
#   A100 SXM:  third-generation NVLink, 600 GB/s bidirectional (A100 datasheet) -> 300 GB/s.
#   L40S:      no NVLink; PCIe Gen4 x16, 64 GB/s bidirectional (L40S datasheet) -> 32 GB/s.
# link_latency_s is an assumption, not a measurement: NCCL's small-message all-reduce on one
# NVLink node takes ~10-30 us for 2-8 GPUs, i.e. a few us per ring step; 5 us per step on
# NVLink, 10 us over PCIe (host bridges, no direct peer path on most boards).
GPU_SPECS: dict[str, GPUSpec] = {
    "h100-sxm": GPUSpec("h100-sxm", peak_bf16_tflops=989.0, achieved_tflops=400.0,
                        hbm_bytes=80 * 10**9, hbm_bandwidth_Bps=3.35e12,
                        link_bw_Bps=450e9, link_latency_s=5e-6),
    "h200": GPUSpec("h200", peak_bf16_tflops=989.0, achieved_tflops=400.0,
                    hbm_bytes=141 * 10**9, hbm_bandwidth_Bps=4.8e12,
                    link_bw_Bps=450e9, link_latency_s=5e-6),
    "a100-80g": GPUSpec("a100-80g", peak_bf16_tflops=312.0, achieved_tflops=190.0,
                        hbm_bytes=80 * 10**9, hbm_bandwidth_Bps=2.039e12,
                        link_bw_Bps=300e9, link_latency_s=5e-6),
    "l40s": GPUSpec("l40s", peak_bf16_tflops=362.0, achieved_tflops=180.0,
                    hbm_bytes=48 * 10**9, hbm_bandwidth_Bps=864e9,
                    link_bw_Bps=32e9, link_latency_s=10e-6),
}


def get_gpu(name: str) -> GPUSpec:
    try:
        return GPU_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(sorted(GPU_SPECS))}") from None


@dataclass(frozen=True)
class ModelSpec:
    """A model served with tensor parallelism `tp` and `dtype_bytes` per weight/KV element.

    TP follows Megatron sharding: attention heads and MLP columns split across GPUs, so weights
    and FLOPs divide by tp (embedding and LM head vocab-parallel; the replicated norms are
    negligible). KV heads split too; when tp > n_kv_heads each GPU holds a replica of one.
    """
    model: ModelArgs
    tp: int = 1
    dtype_bytes: int = 2

    def __post_init__(self):
        m = self.model
        positive_int(self.tp, "ModelSpec.tp")
        if self.dtype_bytes not in (1, 2, 4):
            raise ValueError(f"ModelSpec.dtype_bytes must be 1, 2 or 4, got {self.dtype_bytes!r}")
        if m.n_heads % self.tp:
            raise ValueError(f"tp {self.tp} does not divide n_heads {m.n_heads} of {m.name}")
        if m.n_kv_heads % self.tp and self.tp % m.n_kv_heads:
            raise ValueError(f"tp {self.tp} and n_kv_heads {m.n_kv_heads} of {m.name}: "
                             "one must divide the other")

    @property
    def name(self) -> str:
        return self.model.name if self.tp == 1 else f"{self.model.name}-tp{self.tp}"

    def with_tp(self, tp: int) -> "ModelSpec":
        """The same model and dtype served at another TP degree (checked as any spec)."""
        return ModelSpec(self.model, tp=tp, dtype_bytes=self.dtype_bytes)

    @cached_property
    def allreduce_bytes_per_token(self) -> int:
        """Bytes one token contributes to each TP all-reduce: its hidden state, dim * dtype."""
        return self.model.dim * self.dtype_bytes

    @cached_property
    def weight_bytes(self) -> int:
        """All weights, all GPUs together."""
        return self.model.num_params * self.dtype_bytes

    @cached_property
    def weight_bytes_per_gpu(self) -> int:
        return math.ceil(self.weight_bytes / self.tp)

    @cached_property
    def kv_heads_per_gpu(self) -> int:
        return max(1, self.model.n_kv_heads // self.tp)

    @cached_property
    def kv_bytes_per_token_per_gpu(self) -> int:
        """2 (K, V) * n_layers * kv_heads_per_gpu * head_dim * dtype_bytes."""
        m = self.model
        return 2 * m.n_layers * self.kv_heads_per_gpu * m.head_dim * self.dtype_bytes

    @cached_property
    def flops_per_token(self) -> int:
        """Matmul FLOPs per token, all GPUs: 2 * non-embedding params (LM head included)."""
        return 2 * self.model.num_nonembed_params

    @cached_property
    def attn_flops_per_ctx_token(self) -> int:
        """Attention FLOPs, all GPUs, per (query, attended key) pair: 4 * L * n_heads * head_dim
        (QK^T and PV are n_heads*head_dim MACs each per layer, 2 FLOPs per MAC)."""
        m = self.model
        return 4 * m.n_layers * m.n_heads * m.head_dim



MODEL_SPECS: dict[str, ModelSpec] = {
    "llama-3-8b": ModelSpec(get_model_config("llama-3-8b"), tp=1),
    "llama-3-70b": ModelSpec(get_model_config("llama-3-70b"), tp=4),
    "llama-3-70b-tp8": ModelSpec(get_model_config("llama-3-70b"), tp=8),
    "qwen2-7b": ModelSpec(get_model_config("qwen2-7b"), tp=1),
}


def get_model_spec(name: str) -> ModelSpec:
    try:
        return MODEL_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown model spec {name!r}; known: "
                         f"{', '.join(sorted(MODEL_SPECS))}") from None


def kv_capacity_tokens(model_spec: ModelSpec, gpu: GPUSpec, mem_fraction: float = 0.9) -> int:
    """Tokens of KV that fit on each GPU: floor((hbm * mem_fraction - weights) / kv_per_token).

    mem_fraction is the static share (weights + KV pool) as in SGLang's --mem-fraction-static;
    the rest is left to activations, CUDA graphs and the allocator. Every GPU of a TP group
    holds the same tokens, so this is also the group's capacity.
    """
    positive_fraction(mem_fraction, "mem_fraction")
    free = gpu.hbm_bytes * mem_fraction - model_spec.weight_bytes_per_gpu
    if free <= 0:
        raise ValueError(f"{model_spec.name} weights ({model_spec.weight_bytes_per_gpu} B per GPU)"
                         f" do not fit in {mem_fraction} of {gpu.name} memory ({gpu.hbm_bytes} B)")
    return int(free // model_spec.kv_bytes_per_token_per_gpu)
