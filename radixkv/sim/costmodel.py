"""Step-time model of a simulated GPU (roofline: compute time vs. bytes read), torch-free.

Notation (`ModelSpec` / `GPUSpec` in radixkv.sim.specs):
  P   = model.num_nonembed_params (LM head included, embedding lookup not)
  A   = 4 * n_layers * n_heads * head_dim   FLOPs per (query token, attended token): QK^T and
        PV are each n_heads*head_dim multiply-adds per layer, 2 FLOPs per multiply-add
  W   = weight_bytes_per_gpu = num_params * dtype_bytes / tp
  K   = kv_bytes_per_token_per_gpu = 2 * n_layers * max(1, n_kv_heads / tp) * head_dim * dtype
  R   = gpu.achieved_tflops * 1e12          sustained FLOP/s of one GPU
  BW  = hbm_bandwidth_Bps * achieved_bw_fraction   sustained bytes/s of one GPU

A prefill segment (p, n) computes n new tokens after p cached ones. The token at 0-based
position c attends to c + 1 tokens (the cached prefix, earlier new tokens and itself), so

  FLOPs(p, n) = 2*P*n + A * sum_{c=p}^{p+n-1} (c + 1) = 2*P*n + A * (n*p + n*(n+1)/2)

A decode request with context_len c (tokens already in its KV cache) is the segment (c, 1):
FLOPs = 2*P + A*(c + 1); it reads c tokens of KV. FLOPs above are for the whole TP group;
each of the tp GPUs does 1/tp of them at rate R, in parallel. Bytes moved per GPU in one step:
the weights once, the cached KV each prefill segment and decode request attends to, and the
K and V of every new token written to the pool (T = sum of n + number of decodes):

  bytes = W + K * (sum of prefix lengths p + sum of decode context lengths c) + K * T

Tensor parallelism (Megatron): two all-reduces per layer (after attention, after the MLP) of
the step's hidden states, T * dim * dtype bytes, on a ring over the GPU's link (LBW one way,
latency LAT per ring step):

  allreduce(T) = 2 * L * (2*(tp-1)/tp * T*dim*dtype / LBW + 2*(tp-1) * LAT)   (0 when tp = 1)
  device(F, B, T) = max(F / (tp * R), B / BW) + allreduce(T)
  prefill_time(segs)    = device(FLOPs(segs), bytes(segs, []), T)
  decode_time(ctxs)     = device(FLOPs(ctxs), bytes([], ctxs), T)
  step_time(segs, ctxs) = device(FLOPs(all), bytes(segs, ctxs), T) + step_overhead_s

prefill_time and decode_time are device time for that work alone; step_time is what one engine
iteration costs (one weights read shared by the mixed batch, plus host overhead) and is what a
simulator should charge. The all-reduce is not overlapped with compute. Not modelled: the LM
head's vocab-parallel gather, kernel-launch gaps inside a step (folded into R and the
overhead). A measured profile (radixkv.sim.profile, `CostModel.from_profile`) replaces these
rates with coefficients fitted to a real executor.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixkv.sim.specs import GPUSpec, ModelSpec, get_gpu, get_model_spec
from radixkv.argcheck import finite_at_least

if TYPE_CHECKING:
    from radixkv.sim.profile import ProfiledCostModel

# Host-side cost of one engine iteration in a Python serving loop: scheduling, building the
# batch metadata, copying inputs to the device, sampling and handing tokens back. An
# assumption, not a measurement: when this work is not overlapped with the GPU it is typically
# a few ms per step; 3 ms is the middle of a 2-5 ms range. Pass 0 to model an engine that
# overlaps scheduling with the previous step entirely.
DEFAULT_STEP_OVERHEAD_S = 3e-3


def _check_segments(segments: Sequence[tuple[int, int]]) -> None:
    for seg in segments:
        if len(seg) != 2:
            raise ValueError(f"prefill segment must be (prefix_len, new_len), got {seg!r}")
        p, n = seg
        if not isinstance(p, int) or p < 0:
            raise ValueError(f"prefix_len must be an int >= 0, got {p!r}")
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"new_len must be an int >= 1, got {n!r}")


def _check_contexts(context_lens: Sequence[int]) -> None:
    for c in context_lens:
        if not isinstance(c, int) or c < 0:
            raise ValueError(f"decode context_len must be an int >= 0, got {c!r}")


def _new_tokens(segments: Sequence[tuple[int, int]], context_lens: Sequence[int]) -> int:
    return sum(n for _, n in segments) + len(context_lens)


@dataclass(frozen=True)
class CostModel:
    model_spec: ModelSpec
    gpu: GPUSpec
    step_overhead_s: float = DEFAULT_STEP_OVERHEAD_S
    uncovered: str | None = None    # why measured tables were not used, when they were asked

    def __post_init__(self):
        finite_at_least(self.step_overhead_s, "step_overhead_s", 0)

    @classmethod
    def named(cls, model: str, gpu: str, tp: int | None = None, **kw) -> "CostModel":
        """CostModel.named("llama-3-8b", "h100-sxm"); tp overrides the spec's TP degree."""
        spec = get_model_spec(model)
        return cls(spec if tp is None else spec.with_tp(tp), get_gpu(gpu), **kw)

    @staticmethod
    def from_profile(path) -> "ProfiledCostModel":
        """The step-time model fitted by `radixkv calibrate` (a JSON profile): the same
        step_time / prefill_time / decode_time interface, priced from measured coefficients."""
        from radixkv.sim.profile import load_profile
        return load_profile(path).cost_model()

    @property
    def label(self) -> str:
        return f"{self.model_spec.name}@{self.gpu.name}"

    @property
    def device_name(self) -> str:
        """The simulated device's name (a named GPU here; a profile's device otherwise)."""
        return self.gpu.name

    @property
    def timing(self) -> str:
        """What prices the steps, as every output's metadata names it."""
        why = "" if self.uncovered is None else f"; {self.uncovered}"
        return f"roofline: {self.gpu.achieved_tflops:g} TFLOP/s assumed{why}"

    # ---- FLOPs and bytes -------------------------------------------------------------------
    def prefill_flops(self, segments: Sequence[tuple[int, int]]) -> int:
        """Total FLOPs (whole TP group) of the prefill segments, exact integer."""
        _check_segments(segments)
        ms = self.model_spec
        linear = attn_pairs = 0
        for p, n in segments:
            linear += n
            attn_pairs += n * p + n * (n + 1) // 2   # sum_{c=p}^{p+n-1} (c + 1)
        return ms.flops_per_token * linear + ms.attn_flops_per_ctx_token * attn_pairs

    def decode_flops(self, context_lens: Sequence[int]) -> int:
        """Total FLOPs of one decode token per request: the segment (c, 1) for each c."""
        _check_contexts(context_lens)
        ms = self.model_spec
        return sum(ms.flops_per_token + ms.attn_flops_per_ctx_token * (c + 1)
                   for c in context_lens)

    def bytes_per_gpu(self, prefill_segments: Sequence[tuple[int, int]] = (),
                      decode_context_lens: Sequence[int] = ()) -> int:
        """HBM bytes one GPU moves in a step: weights once + cached KV attended to + the new
        tokens' K and V written."""
        _check_segments(prefill_segments)
        _check_contexts(decode_context_lens)
        kv_read = sum(p for p, _ in prefill_segments) + sum(decode_context_lens)
        ms = self.model_spec
        new = _new_tokens(prefill_segments, decode_context_lens)
        return ms.weight_bytes_per_gpu + ms.kv_bytes_per_token_per_gpu * (kv_read + new)

    def allreduce_time(self, num_tokens: int) -> float:
        """Seconds of the step's TP all-reduces: 2 per layer over num_tokens hidden states."""
        tp = self.model_spec.tp
        if tp == 1 or num_tokens == 0:
            return 0.0
        msg = num_tokens * self.model_spec.allreduce_bytes_per_token
        one = 2 * (tp - 1) / tp * msg / self.gpu.link_bw_Bps + 2 * (tp - 1) * self.gpu.link_latency_s
        return 2 * self.model_spec.model.n_layers * one

    def _device_time(self, flops: int, nbytes: int, num_tokens: int) -> float:
        compute = flops / (self.model_spec.tp * self.gpu.achieved_flops)
        memory = nbytes / self.gpu.achieved_bw_Bps
        return max(compute, memory) + self.allreduce_time(num_tokens)

    # ---- times -----------------------------------------------------------------------------
    def prefill_time(self, segments: Sequence[tuple[int, int]]) -> float:
        """Device seconds for a prefill-only batch of (prefix_len, new_len) segments."""
        if not segments:
            return 0.0
        return self._device_time(self.prefill_flops(segments), self.bytes_per_gpu(segments),
                                 _new_tokens(segments, ()))

    def decode_time(self, context_lens: Sequence[int]) -> float:
        """Device seconds for one decode token for each request (context_len = cached tokens)."""
        if not context_lens:
            return 0.0
        return self._device_time(self.decode_flops(context_lens),
                                 self.bytes_per_gpu((), context_lens), len(context_lens))

    def step_time(self, prefill_segments: Sequence[tuple[int, int]] = (),
                  decode_context_lens: Sequence[int] = ()) -> float:
        """Seconds for one engine step running both kinds together; 0.0 for an empty step."""
        if not prefill_segments and not decode_context_lens:
            return 0.0
        _check_segments(prefill_segments)
        _check_contexts(decode_context_lens)
        # the integers of prefill_flops + decode_flops and bytes_per_gpu, in one pass
        linear = pairs = read = 0
        for p, n in prefill_segments:
            linear += n
            pairs += n * p + n * (n + 1) // 2
            read += p
        b, ctx = len(decode_context_lens), sum(decode_context_lens)
        tokens = linear + b
        ms = self.model_spec
        flops = ms.flops_per_token * tokens + ms.attn_flops_per_ctx_token * (pairs + ctx + b)
        nbytes = ms.weight_bytes_per_gpu + ms.kv_bytes_per_token_per_gpu * (read + ctx + tokens)
        return self._device_time(flops, nbytes, tokens) + self.step_overhead_s

    def decode_step_time(self, batch: int, ctx_sum: int, ctx_max: int) -> float:
        """step_time((), contexts) of a decode-only step, to the bit, from len(contexts),
        sum(contexts) and max(contexts): what a run of decode steps prices each step with."""
        ms = self.model_spec
        flops = ms.flops_per_token * batch + ms.attn_flops_per_ctx_token * (ctx_sum + batch)
        nbytes = ms.weight_bytes_per_gpu + ms.kv_bytes_per_token_per_gpu * (ctx_sum + batch)
        return self._device_time(flops, nbytes, batch) + self.step_overhead_s

    def recompute_s(self, depth: int, n: int) -> float:
        """Compute seconds of n tokens after depth cached ones (the `cost` eviction order)."""
        return self.prefill_flops([(depth, n)]) / (self.model_spec.tp * self.gpu.achieved_flops)

    # ---- conveniences ----------------------------------------------------------------------
    def prefill_tokens_per_s(self, prompt_len: int = 4096, cached_len: int = 0) -> float:
        """New tokens/s of a one-request prefill step (overhead included): prompt_len new tokens
        computed after cached_len tokens found in the cache."""
        return prompt_len / self.step_time([(cached_len, prompt_len)], ())

    def decode_tokens_per_s(self, batch_size: int, context_len: int) -> float:
        """Tokens/s of a decode step of batch_size requests, each with context_len cached."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        return batch_size / self.step_time((), [context_len] * batch_size)
