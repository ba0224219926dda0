"""Llama-family decoder (Llama 2/3/3.1, Qwen2) running over a paged KV pool.

One forward handles a packed batch: prefill, extend-after-cached-prefix and decode are the
same code path. The forward takes the attention backend's per-forward plan (an AttnBatch,
see model/attention.py); per layer, new K/V are written to their slots and the backend
attends the new queries over the pool. Token-wise layers (norms, projections, feed-forward,
LM head) run through the backend too, which may run them on fixed row tiles. A plan built
with plain AttnBatch.build runs on the default "sdpa" backend.
RoPE uses Hugging Face's rotate_half convention, so HF q/k weights load without permutation.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radixkv.model.attention import AttentionBackend, attention_backend
from radixkv.model.kv_pool import AttnBatch, KVPool
from radixkv.shapes import ModelArgs


DEFAULT_BACKEND = attention_backend("sdpa")   # runs plans built without a backend


def rope_inv_freq(args: ModelArgs) -> Tensor:
    """[head_dim // 2] float32 inverse frequencies, with Llama-3.1 scaling when configured."""
    d = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if args.rope_scaling is None:
        return inv_freq
    factor, low_ff, high_ff, old_ctx = args.rope_scaling
    low_wavelen, high_wavelen = old_ctx / low_ff, old_ctx / high_ff
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths are divided by factor, short ones kept, the band between interpolated.
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - low_ff) / (high_ff - low_ff)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [T, H, D]; cos, sin [T, 1, D]."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **factory):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, **factory))

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in float32, scale in the model dtype (as HF's LlamaRMSNorm).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int, **factory):
        super().__init__()
        self.layer_id, self.n_heads, self.n_kv_heads, self.head_dim = (
            layer_id, args.n_heads, args.n_kv_heads, args.head_dim)
        q_dim, kv_dim = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
        self.wqkv = nn.Linear(args.dim, q_dim + 2 * kv_dim, bias=args.qkv_bias, **factory)
        self.wo = nn.Linear(q_dim, args.dim, bias=False, **factory)
        self.split = (q_dim, kv_dim, kv_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVPool, batch: AttnBatch,
                backend: AttentionBackend) -> Tensor:
        """x [T, dim] (normed) -> [T, dim]; writes this layer's new K/V to batch.new_slots."""
        T = x.shape[0]
        q, k, v = backend.token_wise(self.wqkv, x).split(self.split, dim=-1)
        q = apply_rope(q.view(T, self.n_heads, self.head_dim), cos, sin)       # [T, H, D]
        k = apply_rope(k.view(T, self.n_kv_heads, self.head_dim), cos, sin)    # [T, Hkv, D]
        kv.write(self.layer_id, batch.new_slots, k, v.view(T, self.n_kv_heads, self.head_dim))
        o = backend.attend(self.layer_id, q, kv, batch)                         # [T, H * D]
        return backend.token_wise(self.wo, o)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x); w1 = gate_proj, w3 = up_proj, w2 = down_proj."""

    def __init__(self, args: ModelArgs, **factory):
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.intermediate_size, bias=False, **factory)
        self.w3 = nn.Linear(args.dim, args.intermediate_size, bias=False, **factory)
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer_id: int, **factory):
        super().__init__()
        self.attention = Attention(args, layer_id, **factory)
        self.feed_forward = FeedForward(args, **factory)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, **factory)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, **factory)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: KVPool, batch: AttnBatch,
                backend: AttentionBackend) -> Tensor:
        rows = backend.token_wise                   # row-wise layers: all T rows, or fixed tiles
        h = x + self.attention(rows(self.attention_norm, x), cos, sin, kv, batch, backend)
        return h + rows(lambda t: self.feed_forward(self.ffn_norm(t)), h)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.args = args
        factory = {"device": device, "dtype": dtype}
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, **factory)
        self.layers = nn.ModuleList(TransformerBlock(args, i, **factory) for i in range(args.n_layers))
        self.norm = RMSNorm(args.dim, args.norm_eps, **factory)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False, **factory)
        self.tie_weights()
        # A plain attribute, not a buffer: module.to(dtype) must not round it to bf16.
        self._inv_freq = rope_inv_freq(args)
        self._inv_freq_on: dict[torch.device, Tensor] = {}
        self._rope_table_on: dict[torch.device, tuple[Tensor, Tensor]] = {}

    def tie_weights(self) -> None:
        """Share the LM head with the embedding when configured (re-run after to_empty)."""
        if self.args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_random(self, seed: int, std: float = 0.02) -> "Transformer":
        """Deterministic weights: N(0, std) drawn on a seeded CPU generator, norms at 1.

        The same seed gives identical weights on any device or dtype (up to the cast).
        """
        g = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
        return self

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions [T] -> cos, sin [T, 1, head_dim] in float32."""
        inv = self._inv_freq_on.get(positions.device)
        if inv is None:
            inv = self._inv_freq_on[positions.device] = self._inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * inv[None, :]                       # [T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]                     # [T, 1, D]
        return emb.cos(), emb.sin()

    def rope_from_table(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """As rope(), gathered from one table over [0, max_seq_len) computed once per device,
        so a position's cos/sin never depend on which other positions share the call."""
        top = int(positions.max())
        if top >= self.args.max_seq_len:
            raise ValueError(f"position {top} exceeds max_seq_len {self.args.max_seq_len}")
        table = self._rope_table_on.get(positions.device)
        if table is None:
            table = self._rope_table_on[positions.device] = self.rope(
                torch.arange(self.args.max_seq_len, device=positions.device))
        cos, sin = table                                                        # [max_seq_len, 1, D]
        return cos[positions], sin[positions]

    def forward(self, input_ids: Tensor, positions: Tensor, kv: KVPool, batch: AttnBatch,
                return_all: bool = False) -> Tensor:
        """input_ids, positions [T] (packed new tokens of all sequences); batch: the attention
        backend's plan, e.g. attention_backend("batch-invariant").plan(prefix_lens, ctx_slots).

        Returns float32 logits [num_seqs, vocab] of each sequence's last new token, or
        [T, vocab] for every new token when return_all.
        """
        T = input_ids.shape[0]
        if T != batch.num_tokens or positions.shape[0] != T:
            raise ValueError(f"forward: {T} input ids and {positions.shape[0]} positions for a batch "
                             f"of {batch.num_tokens} new tokens")
        if batch.max_slot >= kv.num_slots:
            raise ValueError(f"forward: slot {batch.max_slot} is outside the KV pool of {kv.num_slots} slots")
        backend = batch.backend if batch.backend is not None else DEFAULT_BACKEND
        with backend.running(input_ids.device):
            # A batch-invariant backend must not let the batch change a position's cos/sin.
            cos, sin = (self.rope_from_table if backend.batch_invariant else self.rope)(positions)
            x = self.tok_embeddings(input_ids)                                  # [T, dim]
            for layer in self.layers:
                x = layer(x, cos, sin, kv, batch, backend)
            if not return_all:
                x = x[batch.last_index]                                         # [B, dim]
            return backend.token_wise(lambda t: self.output(self.norm(t)), x).float()
