"""Attention backends: how one forward's attention and token-wise layers are executed.

A backend turns a batch's (prefix_lens, ctx_slots) into its per-forward plan, an AttnBatch
that carries the backend, and the Transformer asks that backend to (a) attend new queries
over the paged KV pool and (b) run token-wise layers (norms, projections, feed-forward, LM
head) over the packed [T, *] rows. Backends are registered by name in ATTENTION_BACKENDS
and built with `attention_backend(name, **options)`, so another kernel (a paged
flex_attention or Triton backend on GPU) plugs in the same way.

  sdpa             each tile is one sequence: its context is gathered into a padded [B, C]
                   grid and one F.scaled_dot_product_attention call covers the batch;
                   token-wise layers run on all T rows at once.
  batch-invariant  every token's K/V and logits are bit-identical whatever else shares its
                   forward (other requests, a cached prefix instead of a full prefill,
                   another chunking). Token-wise layers run on fixed tiles of `tile` rows;
                   attention runs per query tile of `q_tile` rows over key blocks of `block`
                   tokens aligned to absolute positions, with a sequential online softmax:
                   blocks past a query's position are exact no-ops, so the padded context
                   length does not matter. Batched matmuls go in fixed chunks of `bmm_chunk`.
                   On CPU it runs on at most two threads: a thread's share of an elementwise
                   op then stays a multiple of the vector width, so exp/silu never take the
                   (differently rounded) scalar tail.
  paged            K/V are read straight from the pool through each sequence's slot table:
                   PyTorch's flex_attention over the layer's whole pool [1, Hkv, N, D], with
                   a block mask listing, per sequence, the pool blocks its slots fall in and a
                   mask_mod mapping a pool slot to its position in that sequence (-1: not in
                   its context). No padded gather of K/V. Compiled (fused kernel) on CUDA, the
                   default there; eager on the CPU, where it materialises [B, H, Q, N] scores,
                   so it is for tests with small pools only.
"""
from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from radixkv.model.kv_pool import AttnBatch, KVPool
from radixkv.registry import Registry
from radixkv.argcheck import positive_int


class AttentionBackend(ABC):
    """One way of running a forward's attention and token-wise layers (see module doc)."""
    name: ClassVar[str]
    batch_invariant: ClassVar[bool] = False    # per-token results independent of the batch

    def plan(self, prefix_lens: Sequence[int], ctx_slots: Sequence[Sequence[int] | np.ndarray],
             device: torch.device | str = "cpu") -> AttnBatch:
        """The per-forward plan: one query tile per sequence unless a backend tiles finer."""
        return AttnBatch.build(prefix_lens, ctx_slots, device, backend=self)

    def token_wise(self, fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """fn applied to the rows of x [T, d]; fn must treat rows independently."""
        return fn(x)

    @contextmanager
    def running(self, device: torch.device) -> Iterator[None]:
        """Held around a whole forward (thread settings and the like)."""
        yield

    @abstractmethod
    def attend(self, layer: int, q: Tensor, kv: KVPool, batch: AttnBatch) -> Tensor:
        """q [T, H, D] (RoPE applied; this layer's new K/V already written) -> [T, H * D]."""


ATTENTION_BACKENDS: Registry[type[AttentionBackend]] = Registry("attention backend")


def attention_backend(name: str, **options) -> AttentionBackend:
    """The backend registered as `name`, built with those `options` its constructor takes
    (so one set of settings can be handed to whichever backend is chosen)."""
    cls = ATTENTION_BACKENDS.get(name)
    accepted = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in accepted})


@ATTENTION_BACKENDS.register("sdpa")
class SdpaBackend(AttentionBackend):
    """Padded gather of each sequence's context, one scaled_dot_product_attention per layer."""
    name = "sdpa"

    def attend(self, layer: int, q: Tensor, kv: KVPool, batch: AttnBatch) -> Tensor:
        kc, vc = kv.gather(layer, batch.ctx_index)                              # [B, C, Hkv, D]
        qp = q[batch.q_index]                                                   # [B, Q, H, D]
        o = F.scaled_dot_product_attention(
            qp.transpose(1, 2), kc.transpose(1, 2).to(q.dtype), vc.transpose(1, 2).to(q.dtype),
            attn_mask=batch.mask, enable_gqa=q.shape[1] != kc.shape[2])          # [B, H, Q, D]
        B, _, Q, _ = o.shape
        return o.transpose(1, 2).reshape(B * Q, -1)[batch.out_index]            # [T, H * D]


@ATTENTION_BACKENDS.register("paged")
class PagedBackend(AttentionBackend):
    """flex_attention reading K/V from the pool through the slot table (module doc)."""
    name = "paged"

    def __init__(self, kv_block: int = 128, q_block: int = 128, compile: bool | None = None):
        self.kv_block = positive_int(kv_block, "paged attention: kv_block")
        self.q_block = positive_int(q_block, "paged attention: q_block")
        self.compile = compile
        self._flex: dict[bool, Callable] = {}
        self._mask: tuple = (None, 0, None)     # (batch, n, block mask): one per forward, not per layer

    def _kernel(self, device: torch.device) -> Callable:
        from torch.nn.attention.flex_attention import flex_attention
        fused = device.type == "cuda" if self.compile is None else self.compile
        if fused not in self._flex:
            self._flex[fused] = torch.compile(flex_attention, dynamic=True) if fused else flex_attention
        return self._flex[fused]

    def _block_mask(self, kv: KVPool, batch: AttnBatch, n: int):
        """Pool blocks each query tile reads, and the slot -> logical position map [NT, n]."""
        from torch.nn.attention.flex_attention import BlockMask
        dev, KB = batch.ctx_index.device, self.kv_block
        NT, C = batch.ctx_index.shape
        valid = torch.arange(C, device=dev)[None, :] <= batch.q_pos.amax(1, keepdim=True)   # [NT, C]
        logical = torch.full((NT, n), -1, dtype=torch.int32, device=dev)
        rows = torch.arange(NT, device=dev)[:, None].expand(NT, C)
        cols = torch.arange(C, device=dev, dtype=torch.int32)[None, :].expand(NT, C)
        logical[rows[valid], batch.ctx_index[valid]] = cols[valid]                     # [NT, n]
        nblk = -(-n // KB)
        used = torch.zeros(NT, nblk, dtype=torch.bool, device=dev)
        used[rows[valid], batch.ctx_index[valid] // KB] = True                        # [NT, nblk]
        counts = used.sum(1, dtype=torch.int32)                                       # [NT]
        order = torch.argsort((~used).to(torch.int8), dim=1, stable=True).to(torch.int32)
        q_pos = batch.q_pos

        def mask_mod(b, h, q_idx, kv_idx):
            pos = logical[b, kv_idx]
            return (pos >= 0) & (pos <= q_pos[b, q_idx])

        Q = batch.q_index.shape[1]
        nq = -(-Q // self.q_block)                  # every query block of a tile reads its blocks
        return BlockMask.from_kv_blocks(counts[:, None, None].expand(NT, 1, nq).contiguous(),
                                        order[:, None, None, :].expand(NT, 1, nq, nblk).contiguous(),
                                        BLOCK_SIZE=(self.q_block, KB), mask_mod=mask_mod,
                                        seq_lengths=(Q, n))

    def attend(self, layer: int, q: Tensor, kv: KVPool, batch: AttnBatch) -> Tensor:
        n = batch.max_slot + 1                                                  # pool prefix in use
        if self._mask[0] is not batch or self._mask[1] != n:
            self._mask = (batch, n, self._block_mask(kv, batch, n))
        bm = self._mask[2]
        k = kv.buf[0, layer, :n].permute(1, 0, 2)[None].to(q.dtype)              # [1, Hkv, n, D]
        v = kv.buf[1, layer, :n].permute(1, 0, 2)[None].to(q.dtype)
        qp = q[batch.q_index].transpose(1, 2)                                   # [NT, H, Q, D]
        NT = qp.shape[0]
        o = self._kernel(q.device)(qp, k.expand(NT, -1, -1, -1), v.expand(NT, -1, -1, -1),
                                   block_mask=bm, enable_gqa=q.shape[1] != k.shape[1])  # [NT, H, Q, D]
        return o.transpose(1, 2).reshape(NT * qp.shape[2], -1)[batch.out_index]      # [T, H * D]


def default_backend_name(device: torch.device | str) -> str:
    """The backend an executor uses when none is named: paged on CUDA, sdpa elsewhere."""
    return "paged" if torch.device(device).type == "cuda" else "sdpa"


# ---- fixed-shape kernels of the batch-invariant backend ------------------------------------
def tiled(fn: Callable[[Tensor], Tensor], x: Tensor, tile: int) -> Tensor:
    """fn over fixed [tile, d] row tiles of x [T, d] (zero-padded): row results independent of T."""
    T = x.shape[0]
    xp = F.pad(x, (0, 0, 0, (-T) % tile))
    return torch.cat([fn(xp[i:i + tile]) for i in range(0, xp.shape[0], tile)])[:T]


def chunked_bmm(a: Tensor, b: Tensor, chunk: int) -> Tensor:
    """a [N, m, k] @ b [N, k, n] in fixed batches of `chunk` (kernel choice independent of N)."""
    N = a.shape[0]
    pad = (-N) % chunk
    a, b = F.pad(a, (0, 0, 0, 0, 0, pad)), F.pad(b, (0, 0, 0, 0, 0, pad))
    return torch.cat([torch.bmm(a[i:i + chunk], b[i:i + chunk]) for i in range(0, N + pad, chunk)])[:N]


@ATTENTION_BACKENDS.register("batch-invariant")
class BatchInvariantBackend(AttentionBackend):
    """Fixed-shape kernels only, so a token's results never depend on its batch (module doc)."""
    name = "batch-invariant"
    batch_invariant = True

    def __init__(self, tile: int = 64, q_tile: int = 32, block: int = 128, bmm_chunk: int = 16):
        sizes = {"tile": tile, "q_tile": q_tile, "block": block, "bmm_chunk": bmm_chunk}
        self.tile, self.q_tile, self.block, self.bmm_chunk = (
            positive_int(v, f"batch-invariant attention: {k}") for k, v in sizes.items())

    def plan(self, prefix_lens: Sequence[int], ctx_slots: Sequence[Sequence[int] | np.ndarray],
             device: torch.device | str = "cpu") -> AttnBatch:
        # Query tiles of q_tile rows, contexts padded to whole key blocks; an even tile count
        # keeps the [NT * H, Q] elementwise ops vector-aligned.
        return AttnBatch.build(prefix_lens, ctx_slots, device, q_tile=self.q_tile,
                               block=self.block, tile_multiple=2, backend=self)

    def token_wise(self, fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        return tiled(fn, x, self.tile)

    @contextmanager
    def running(self, device: torch.device) -> Iterator[None]:
        threads = torch.get_num_threads()
        if torch.device(device).type == "cpu" and threads > 2:
            torch.set_num_threads(2)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def attend(self, layer: int, q: Tensor, kv: KVPool, batch: AttnBatch) -> Tensor:
        """Per query tile, a sequential online softmax over key blocks of K tokens."""
        K, ch = self.block, self.bmm_chunk
        _, H, D = q.shape
        Hkv = kv.args.n_kv_heads
        (NT, Q), C = batch.q_index.shape, batch.ctx_index.shape[1]
        if C % K:
            raise ValueError(f"batch-invariant attention: plan context width {C} is not a multiple "
                             f"of block {K}; build the plan with this backend's plan()")
        qt = (q[batch.q_index] * (1.0 / math.sqrt(D))).transpose(1, 2)           # [NT, H, Q, D]
        qt = qt.reshape(NT * H, Q, D)
        m = torch.full((NT * H, Q), float("-inf"), device=q.device, dtype=torch.float32)
        acc = torch.zeros(NT * H, Q, D + 1, device=q.device, dtype=torch.float32)  # [.., D | row sum]
        ones = torch.ones(NT, H, K, 1, device=q.device, dtype=q.dtype)
        for b in range(C // K):
            kb, vb = kv.gather(layer, batch.ctx_index[:, b * K:(b + 1) * K])       # [NT, K, Hkv, D]
            kb = kb.to(q.dtype).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)  # [NT, H, K, D]
            vb = vb.to(q.dtype).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
            s = chunked_bmm(qt, kb.reshape(NT * H, K, D).transpose(1, 2), ch).float()  # [NT*H, Q, K]
            allowed = batch.mask[:, :, :, b * K:(b + 1) * K]                        # [NT, 1, Q, K]
            s = s.view(NT, H, Q, K).masked_fill(~allowed, float("-inf")).view(NT * H, Q, K)
            m_new = torch.maximum(m, s.amax(-1))                                    # [NT*H, Q]
            p = torch.exp(s - m_new[..., None]).to(q.dtype)                         # masked -> 0
            vaug = torch.cat([vb, ones], dim=-1).reshape(NT * H, K, D + 1)          # [NT*H, K, D+1]
            acc = acc * torch.exp(m - m_new)[..., None] + chunked_bmm(p, vaug, ch).float()
            m = m_new
        o = (acc[..., :D] / acc[..., D:]).to(q.dtype).view(NT, H, Q, D).transpose(1, 2)  # [NT, Q, H, D]
        return o.reshape(NT * Q, H * D)[batch.out_index]                            # [T, H * D]
