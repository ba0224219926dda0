"""Where the KV bytes live: one paged buffer addressed by slot index, and the per-forward
attention plan (`AttnBatch`) that says which slots each sequence writes and reads.

A slot holds one token's K and V for every layer. The cache layer hands out slot indices
(cache/pool.py owns which are free); this module only stores and gathers bytes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from radixkv.shapes import ModelArgs


class KVPool:
    """K and V of every layer in one buffer of shape [2, n_layers, num_slots, n_kv_heads, head_dim]."""

    def __init__(self, args: ModelArgs, num_slots: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        if not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"KVPool num_slots must be a positive int, got {num_slots!r}")
        self.args, self.num_slots, self.dtype = args, num_slots, dtype
        self.buf = torch.zeros(2, args.n_layers, num_slots, args.n_kv_heads, args.head_dim,
                               device=device, dtype=dtype)

    @property
    def device(self) -> torch.device:
        return self.buf.device

    @property
    def bytes_per_token(self) -> int:
        return self.args.kv_bytes_per_token(self.buf.element_size())

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """slots [T] (int64, on the pool's device); k, v [T, n_kv_heads, head_dim]."""
        self.buf[0, layer].index_copy_(0, slots, k.to(self.dtype))
        self.buf[1, layer].index_copy_(0, slots, v.to(self.dtype))

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots of any shape S -> (k, v), each [*S, n_kv_heads, head_dim] (one indexing op)."""
        k, v = self.buf[:, layer][:, slots].unbind(0)
        return k, v


@dataclass(frozen=True)
class AttnBatch:
    """Plan of one forward over packed tokens: B sequences, T new tokens in all.

    Sequence b has prefix_lens[b] cached tokens and n_new[b] new ones; its context is
    ctx_slots[b] = prefix slots + new slots. Queries are padded to Q = max(n_new) and
    contexts to C = max(prefix_len + n_new); built once per forward, shared by all layers.
    """
    prefix_lens: tuple[int, ...]
    n_new: tuple[int, ...]
    new_slots: torch.Tensor    # [T] pool slot receiving each packed new token's K/V
    ctx_index: torch.Tensor    # [B, C] pool slots of each context, padded with slot 0 (masked)
    q_index: torch.Tensor      # [B, Q] packed token index of query j of seq b (padding: its last token)
    out_index: torch.Tensor    # [T] flat index b * Q + j of packed token t in the padded query grid
    last_index: torch.Tensor   # [B] packed index of each sequence's last new token
    mask: torch.Tensor         # [B, 1, Q, C] bool, True = may attend (causal, offset by prefix_len)
    positions: torch.Tensor    # [T] RoPE position prefix_len[b] + j of each packed token
    max_slot: int

    @property
    def num_seqs(self) -> int:
        return len(self.n_new)

    @property
    def num_tokens(self) -> int:
        return int(self.new_slots.shape[0])

    @classmethod
    def build(cls, prefix_lens: Sequence[int], ctx_slots: Sequence[Sequence[int] | np.ndarray],
              device: torch.device | str = "cpu") -> "AttnBatch":
        if len(prefix_lens) != len(ctx_slots):
            raise ValueError(f"AttnBatch: {len(prefix_lens)} prefix_lens but {len(ctx_slots)} ctx_slots")
        if not prefix_lens:
            raise ValueError("AttnBatch: empty batch")
        ctxs = [np.asarray(c, dtype=np.int64).reshape(-1) for c in ctx_slots]
        pl = []
        for b, (p, c) in enumerate(zip(prefix_lens, ctxs)):
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 0 <= p < len(c):
                raise ValueError(f"AttnBatch: sequence {b} has prefix_len {p!r} but {len(c)} context "
                                 f"slots; need 0 <= prefix_len < len(ctx_slots) (at least one new token)")
            if c.min() < 0:
                raise ValueError(f"AttnBatch: sequence {b} has a negative slot {int(c.min())}")
            pl.append(int(p))
        n_new = [len(c) - p for c, p in zip(ctxs, pl)]
        new = np.concatenate([c[p:] for c, p in zip(ctxs, pl)])
        if len(np.unique(new)) != len(new):
            vals, counts = np.unique(new, return_counts=True)
            raise ValueError(f"AttnBatch: new slot {int(vals[counts > 1][0])} is written twice in one batch")
        B, T = len(ctxs), len(new)
        Q, C = max(n_new), max(len(c) for c in ctxs)
        starts = np.cumsum([0] + n_new[:-1])                       # [B] first packed index of each seq
        ctx_index = np.zeros((B, C), dtype=np.int64)
        q_index = np.empty((B, Q), dtype=np.int64)
        out_index = np.empty(T, dtype=np.int64)
        positions = np.empty(T, dtype=np.int64)
        for b, (c, p, n, s) in enumerate(zip(ctxs, pl, n_new, starts)):
            ctx_index[b, :len(c)] = c
            q_index[b] = s + np.minimum(np.arange(Q), n - 1)
            out_index[s:s + n] = b * Q + np.arange(n)
            positions[s:s + n] = p + np.arange(n)
        to = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
        ctx_len, prefix = to(np.array([len(c) for c in ctxs])), to(np.array(pl))
        q_pos = torch.arange(Q, device=device)[None, :, None]       # [1, Q, 1]
        c_pos = torch.arange(C, device=device)[None, None, :]       # [1, 1, C]
        # Padded query rows (j >= n_new) see the whole context, so no row is fully masked (no NaN).
        mask = (c_pos < ctx_len[:, None, None]) & (c_pos <= prefix[:, None, None] + q_pos)
        return cls(prefix_lens=tuple(pl), n_new=tuple(n_new), new_slots=to(new),
                   ctx_index=to(ctx_index), q_index=to(q_index), out_index=to(out_index),
                   last_index=to(starts + np.array(n_new) - 1), mask=mask[:, None],
                   positions=to(positions), max_slot=max(int(c.max()) for c in ctxs))
