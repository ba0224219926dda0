"""Where the KV bytes live: one paged buffer addressed by slot index, and the per-forward
attention plan (`AttnBatch`) that says which slots each sequence writes and reads.

AttnBatch is the one place that turns (prefix_lens, ctx_slots) into indices: packed
positions and new slots, and the query-tile grid an attention backend reads (one tile per
sequence for a padded SDPA call, or fixed-size tiles over block-aligned contexts for the
batch-invariant kernels of model/attention.py).

A slot holds one token's K and V for every layer. The cache layer hands out slot indices
(cache/pool.py owns which are free); this module only stores and gathers bytes.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from radixkv.shapes import ModelArgs
from radixkv.argcheck import is_int, positive_int


class KVPool:
    """K and V of every layer in one buffer of shape [2, n_layers, num_slots, n_kv_heads, head_dim]."""

    def __init__(self, args: ModelArgs, num_slots: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        num_slots = positive_int(num_slots, "KVPool num_slots")
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

    def copy_to(self, dst: "KVPool", src_slots, dst_slots) -> None:
        """K and V of every layer at `src_slots` here into `dst_slots` of `dst` (a host
        buffer or the device pool: the host tier's store and load)."""
        src = torch.as_tensor(np.asarray(src_slots, dtype=np.int64)).to(self.device)
        idx = torch.as_tensor(np.asarray(dst_slots, dtype=np.int64)).to(dst.device)
        dst.buf.index_copy_(2, idx, self.buf.index_select(2, src).to(dst.device, dst.dtype))

    def run_copies(self, host: "KVPool", copies) -> None:
        """A plan's host-tier copies, in order: "store" device -> host, "load" host -> device."""
        for c in copies:
            if c.kind == "store":
                self.copy_to(host, c.device, c.host)
            else:
                host.copy_to(self, c.host, c.device)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots of any shape S -> (k, v), each [*S, n_kv_heads, head_dim]. index_select copies
        whole rows of one contiguous layer: on a CPU 1.1-6x faster than advanced indexing of the
        strided [2, slots] view, and nearly as fast on scattered slots as on contiguous ones."""
        flat, shape = slots.reshape(-1), (*slots.shape, *self.buf.shape[3:])
        return (self.buf[0, layer].index_select(0, flat).view(shape),
                self.buf[1, layer].index_select(0, flat).view(shape))


@dataclass(frozen=True)
class AttnBatch:
    """Plan of one forward over packed tokens: B sequences, T new tokens in all.

    Sequence b has prefix_lens[b] cached tokens and n_new[b] new ones; its context is
    ctx_slots[b] = prefix slots + new slots. Queries are grouped into NT tiles of Q rows, each
    holding consecutive new tokens of one sequence (padded with that sequence's last token),
    and tile i reads the C pool slots ctx_index[i] (padded with slot 0, masked). By default a
    tile is a whole sequence: NT = B, Q = max(n_new), C = max(prefix_len + n_new). Built once
    per forward, shared by all layers; `backend` is the attention backend that built it
    (None: the model's default).
    """
    prefix_lens: tuple[int, ...]
    n_new: tuple[int, ...]
    new_slots: torch.Tensor    # [T] pool slot receiving each packed new token's K/V
    ctx_index: torch.Tensor    # [NT, C] pool slots each query tile reads, padded with slot 0
    q_index: torch.Tensor      # [NT, Q] packed token index of row j of tile i (padding: its last token)
    q_pos: torch.Tensor        # [NT, Q] position of that token; tile i sees context columns <= it
    out_index: torch.Tensor    # [T] flat index i * Q + j of packed token t in the tile grid
    last_index: torch.Tensor   # [B] packed index of each sequence's last new token
    mask: torch.Tensor         # [NT, 1, Q, C] bool, True = may attend (causal, offset by prefix_len)
    positions: torch.Tensor    # [T] RoPE position prefix_len[b] + j of each packed token
    max_slot: int
    backend: Any = None        # the AttentionBackend that runs this plan (model/attention.py)

    @property
    def num_seqs(self) -> int:
        return len(self.n_new)

    @property
    def num_tokens(self) -> int:
        return int(self.new_slots.shape[0])

    @classmethod
    def build(cls, prefix_lens: Sequence[int], ctx_slots: Sequence[Sequence[int] | np.ndarray],
              device: torch.device | str = "cpu", q_tile: int | None = None, block: int = 1,
              tile_multiple: int = 1, backend: Any = None) -> "AttnBatch":
        """q_tile: rows per query tile (None: one tile per sequence); block: C is rounded up
        to a multiple of it; tile_multiple: NT is rounded up to a multiple of it by repeating
        the last tile (its rows are never read back)."""
        if len(prefix_lens) != len(ctx_slots):
            raise ValueError(f"AttnBatch: {len(prefix_lens)} prefix_lens but {len(ctx_slots)} ctx_slots")
        if not prefix_lens:
            raise ValueError("AttnBatch: empty batch")
        ctxs = [np.asarray(c, dtype=np.int64).reshape(-1) for c in ctx_slots]
        pl = []
        for b, (p, c) in enumerate(zip(prefix_lens, ctxs)):
            if not is_int(p) or not 0 <= p < len(c):
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
        Q = q_tile or max(n_new)
        starts = np.cumsum([0] + n_new[:-1])                       # [B] first packed index of each seq
        positions = np.concatenate([p + np.arange(n) for p, n in zip(pl, n_new)])
        # ---- query tiles: rows j..j+Q of one sequence; context up to the tile's last token
        q_index, q_pos, ctx_len, out_index = [], [], [], []
        for c, p, n, s in zip(ctxs, pl, n_new, starts):
            for j in range(0, n, Q):
                r = np.minimum(np.arange(j, j + Q), n - 1)          # [Q] padded with the last row
                out_index.append(len(q_index) * Q + np.arange(min(Q, n - j)))
                q_index.append(s + r), q_pos.append(p + r), ctx_len.append((c, p + min(j + Q, n)))
        while len(q_index) % tile_multiple:
            q_index.append(q_index[-1]), q_pos.append(q_pos[-1]), ctx_len.append(ctx_len[-1])
        C = -(-max(n for _, n in ctx_len) // block) * block
        ctx_index = np.zeros((len(ctx_len), C), dtype=np.int64)     # [NT, C]
        for i, (c, n) in enumerate(ctx_len):
            ctx_index[i, :n] = c[:n]
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        q_pos_t = to(np.stack(q_pos))                               # [NT, Q]
        # Row j sees columns <= its position: the causal mask offset by prefix_len, and the
        # context's end for padded rows, so no row is fully masked (no NaN).
        mask = torch.arange(C, device=device)[None, None, :] <= q_pos_t[:, :, None]
        return cls(prefix_lens=tuple(pl), n_new=tuple(n_new), new_slots=to(new),
                   ctx_index=to(ctx_index), q_index=to(np.stack(q_index)), q_pos=q_pos_t,
                   out_index=to(np.concatenate(out_index)),
                   last_index=to(starts + np.array(n_new) - 1), mask=mask[:, None],
                   positions=to(positions.astype(np.int64)),
                   max_slot=max(int(c.max()) for c in ctxs), backend=backend)
