"""TorchExecutor: runs a BatchPlan through a real Transformer over a paged KV pool.

All segments of a plan (extends, then decodes) are packed into one forward: input ids
concatenated, position of new token j of a segment = prefix_len + j, one AttnBatch. The
last position of every `sample=True` segment is sampled with the request's SamplingParams
(greedy when None) and its own CPU generator, kept across steps until `release(rid)`.

batch_invariant=True computes every token's hidden state with kernels of fixed shapes, so a
token's KV and logits are bit-identical whatever else shares its forward (other requests,
a cached prefix instead of a full prefill, another chunking). Token-wise layers run on
fixed tiles of `tile` rows; attention runs per query tile of `q_tile` rows over key blocks
of `block` tokens aligned to absolute positions, with a sequential online softmax: blocks
past a query's position are exact no-ops, so the padded context length does not matter.
On CPU it runs on at most two threads: a thread's share of an elementwise op then stays a
multiple of the vector width, so exp/silu never take the (differently rounded) scalar tail.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from radixkv import env
from radixkv.engine.executor import BatchPlan, StepResult
from radixkv.model.kv_pool import AttnBatch, KVPool
from radixkv.model.model import Transformer, apply_rope
from radixkv.shapes import ModelArgs, get_model_config
from radixkv.model.sampling import SamplingParams, sample

GREEDY = SamplingParams()
_BIG_MODEL = 200_000_000   # random weights above this many parameters are drawn on the device


def default_dtype(device: torch.device | str) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def resolve_device(device=None) -> torch.device:
    """`device`, else radixkv.env.device(); a clear error when CUDA is asked for but absent."""
    dev = torch.device(device if device is not None else env.device())
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(dev)!r} requested but CUDA is not available")
    return dev


def _tiled(fn, x: Tensor, tile: int) -> Tensor:
    """fn over fixed [tile, d] row tiles of x [T, d] (zero-padded): row results independent of T."""
    T = x.shape[0]
    xp = F.pad(x, (0, 0, 0, (-T) % tile))
    return torch.cat([fn(xp[i:i + tile]) for i in range(0, xp.shape[0], tile)])[:T]


def _bmm(a: Tensor, b: Tensor, chunk: int) -> Tensor:
    """a [N, m, k] @ b [N, k, n] in fixed batches of `chunk` (kernel choice independent of N)."""
    N = a.shape[0]
    pad = (-N) % chunk
    a, b = F.pad(a, (0, 0, 0, 0, 0, pad)), F.pad(b, (0, 0, 0, 0, 0, pad))
    return torch.cat([torch.bmm(a[i:i + chunk], b[i:i + chunk]) for i in range(0, N + pad, chunk)])[:N]


class _TilePlan:
    """Query tiles of one forward for the batch-invariant attention (built once, all layers).

    NT tiles of Q rows; tile i holds queries of one segment. NB key blocks of K tokens cover
    the longest context any tile needs; shorter contexts are padded with slot 0 (masked).
    """

    def __init__(self, prefix_lens, ctx_slots, Q: int, K: int, device):
        q_idx, q_pos, ctx, out = [], [], [], []
        start = 0
        for p0, c in zip(prefix_lens, ctx_slots):
            n = len(c) - p0
            for j in range(0, n, Q):
                r = np.minimum(np.arange(j, j + Q), n - 1)                 # [Q] padded with the last
                q_idx.append(start + r)
                q_pos.append(p0 + r)
                ctx.append(np.asarray(c[:p0 + min(j + Q, n)], dtype=np.int64))
                out.append(len(q_idx) * Q - Q + np.arange(min(Q, n - j)))
            start += n
        if len(ctx) % 2:                # an even tile count keeps [NT*H, Q] ops vector-aligned
            q_idx.append(q_idx[-1]), q_pos.append(q_pos[-1]), ctx.append(ctx[-1])
        NT, C = len(ctx), max(len(c) for c in ctx)
        self.NB = -(-C // K)
        ctx_index = np.zeros((NT, self.NB * K), dtype=np.int64)                # [NT, NB*K]
        for i, c in enumerate(ctx):
            ctx_index[i, :len(c)] = c
        to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
        self.q_index, self.ctx_index = to(np.stack(q_idx)), to(ctx_index)      # [NT, Q], [NT, NB*K]
        self.q_pos = to(np.stack(q_pos))                                      # [NT, Q]
        self.out_index = to(np.concatenate(out))                              # [T] into NT*Q rows
        self.K = K


class TorchExecutor:
    def __init__(self, model: Transformer, args: ModelArgs, num_slots: int, device=None, dtype=None,
                 batch_invariant: bool = False, tile: int = 64, q_tile: int = 32, block: int = 128,
                 bmm_chunk: int = 16):
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.args = args
        self.kv = KVPool(args, num_slots, self.device, self.dtype)
        self.name = f"torch:{args.name}@{self.device.type}/{str(self.dtype).removeprefix('torch.')}"
        self.batch_invariant = batch_invariant
        self.tile, self.q_tile, self.block, self.bmm_chunk = tile, q_tile, block, bmm_chunk
        self.generators: dict[str, torch.Generator | None] = {}
        self.keep_logits = False
        self.last_logits: dict[str, Tensor] = {}                  # rid -> [vocab] float32, on CPU
        self.busy_s, self.steps, self.tokens_computed = 0.0, 0, 0
        self._rope_tab: tuple[Tensor, Tensor] | None = None

    @classmethod
    def from_config(cls, name_or_dir: str, num_slots: int, seed: int = 0, device=None, dtype=None,
                    **kw) -> "TorchExecutor":
        """A named shape with seeded random weights (tiny-llama, llama-3-8b, ...) or a local HF
        checkpoint directory. Models over 200M parameters are initialised on the device."""
        device = resolve_device(device)
        dtype = dtype or default_dtype(device)
        if Path(name_or_dir).is_dir():
            from radixkv.model.weights import load_hf_checkpoint
            model, args = load_hf_checkpoint(name_or_dir, device=device, dtype=dtype)
            return cls(model, args, num_slots, device, dtype, **kw)
        args = get_model_config(name_or_dir)
        if args.num_params <= _BIG_MODEL or device.type == "cpu":
            model = Transformer(args).init_random(seed)
        else:
            model = Transformer(args, device="meta", dtype=dtype).to_empty(device=device)
            model.tie_weights()
            g = torch.Generator(device=device).manual_seed(seed)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.fill_(1.0) if n.endswith("norm.weight") else p.normal_(0.0, 0.02, generator=g)
        return cls(model, args, num_slots, device, dtype, **kw)

    def release(self, rid: str) -> None:
        """Forget a finished (or aborted) request's generator."""
        self.generators.pop(rid, None)

    # ---- one step ------------------------------------------------------------------------------
    def run(self, plan: BatchPlan) -> StepResult:
        segs = plan.segments
        if not segs:
            return StepResult([], 0.0)
        t0 = time.perf_counter()
        ids = np.concatenate([np.asarray(s.input_ids, dtype=np.int64) for s in segs])   # [T]
        if ids.min() < 0 or ids.max() >= self.args.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.args.vocab_size)][0])
            raise ValueError(f"token id {bad} is outside the model vocabulary "
                             f"[0, {self.args.vocab_size})")
        rows = [i for i, s in enumerate(segs) if s.sample]
        prefix_lens, ctx = [s.prefix_len for s in segs], [s.ctx_slots for s in segs]
        input_ids = torch.from_numpy(ids).to(self.device)
        with torch.inference_mode():
            if self.batch_invariant:
                threads = torch.get_num_threads()
                if self.device.type == "cpu" and threads > 2:
                    torch.set_num_threads(2)
                try:
                    logits = self._forward_invariant(input_ids, prefix_lens, ctx, rows)  # [R, V]
                finally:
                    torch.set_num_threads(threads)
            else:
                batch = AttnBatch.build(prefix_lens, ctx, self.device)
                logits = self.model(input_ids, batch.positions, self.kv, batch)[rows]   # [R, V]
            tokens: list[int | None] = [None] * len(segs)
            if rows:
                reqs = [segs[i].req for i in rows]
                params = [r.sampling or GREEDY for r in reqs]
                gens = [self._generator(r.rid, p) for r, p in zip(reqs, params)]
                out = sample(logits, params, gens).tolist()
                for i, t in zip(rows, out):
                    tokens[i] = t
                if self.keep_logits:
                    cpu = logits.cpu()
                    for k, r in enumerate(reqs):
                        self.last_logits[r.rid] = cpu[k]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        self.busy_s += dt
        self.steps += 1
        self.tokens_computed += len(ids)
        return StepResult(tokens, dt)

    def _generator(self, rid: str, params: SamplingParams) -> torch.Generator | None:
        if rid not in self.generators:
            self.generators[rid] = None if params.greedy else params.make_generator()
        return self.generators[rid]

    # ---- the batch-invariant forward -------------------------------------------------------------
    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin [T, 1, head_dim] gathered from one table computed once (exact per position)."""
        if self._rope_tab is None:
            self._rope_tab = self.model.rope(torch.arange(self.args.max_seq_len, device=self.device))
        top = int(positions.max())
        if top >= self.args.max_seq_len:
            raise ValueError(f"position {top} exceeds max_seq_len {self.args.max_seq_len}")
        cos, sin = self._rope_tab
        return cos[positions], sin[positions]

    def _forward_invariant(self, input_ids: Tensor, prefix_lens, ctx_slots, rows) -> Tensor:
        """Packed forward whose per-token results do not depend on the batch; returns float32
        logits [R, vocab] of the last token of the segments `rows`."""
        m, a, tile = self.model, self.args, self.tile
        H, Hkv, D = a.n_heads, a.n_kv_heads, a.head_dim
        n_new = [len(c) - p for p, c in zip(prefix_lens, ctx_slots)]
        new_slots = torch.from_numpy(np.concatenate(
            [np.asarray(c[p:], dtype=np.int64) for p, c in zip(prefix_lens, ctx_slots)])).to(self.device)
        positions = torch.from_numpy(np.concatenate(
            [p + np.arange(n) for p, n in zip(prefix_lens, n_new)]).astype(np.int64)).to(self.device)
        if new_slots.unique().numel() != new_slots.numel():
            raise ValueError("a KV slot is written twice in one batch")
        if int(max(np.max(c) for c in ctx_slots)) >= self.kv.num_slots:
            raise ValueError(f"a slot is outside the KV pool of {self.kv.num_slots} slots")
        tp = _TilePlan(prefix_lens, ctx_slots, self.q_tile, self.block, self.device)
        cos, sin = self._rope(positions)
        x = m.tok_embeddings(input_ids)                                           # [T, dim]
        T = x.shape[0]
        for li, layer in enumerate(m.layers):
            att = layer.attention
            qkv = _tiled(lambda t: att.wqkv(layer.attention_norm(t)), x, tile)    # [T, (H+2Hkv)D]
            q, k, v = qkv.split(att.split, dim=-1)
            q, k = apply_rope(q.view(T, H, D), cos, sin), apply_rope(k.view(T, Hkv, D), cos, sin)
            self.kv.write(li, new_slots, k, v.view(T, Hkv, D))
            o = self._attention(li, q, tp)                                        # [T, H*D]
            x = x + _tiled(att.wo, o, tile)
            x = x + _tiled(lambda t: layer.feed_forward(layer.ffn_norm(t)), x, tile)
        if not rows:
            return torch.zeros(0, a.vocab_size, device=self.device)
        last = torch.tensor(np.cumsum(n_new)[rows] - 1, device=self.device, dtype=torch.long)
        return _tiled(lambda t: m.output(m.norm(t)), x[last], tile).float()       # [R, V]

    def _attention(self, layer: int, q: Tensor, tp: _TilePlan) -> Tensor:
        """q [T, H, D] -> [T, H*D]: per query tile, a sequential online softmax over key blocks."""
        a, K, ch = self.args, tp.K, self.bmm_chunk
        H, Hkv, D = a.n_heads, a.n_kv_heads, a.head_dim
        NT, Q = tp.q_index.shape
        qt = (q[tp.q_index] * (1.0 / math.sqrt(D))).transpose(1, 2).reshape(NT * H, Q, D)  # [NT*H, Q, D]
        m = torch.full((NT * H, Q), float("-inf"), device=q.device, dtype=torch.float32)
        acc = torch.zeros(NT * H, Q, D + 1, device=q.device, dtype=torch.float32)  # [.., D | row sum]
        ones = torch.ones(NT, H, K, 1, device=q.device, dtype=q.dtype)
        for b in range(tp.NB):
            kb, vb = self.kv.gather(layer, tp.ctx_index[:, b * K:(b + 1) * K])        # [NT, K, Hkv, D]
            kb = kb.to(q.dtype).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)   # [NT, H, K, D]
            vb = vb.to(q.dtype).transpose(1, 2).repeat_interleave(H // Hkv, dim=1)
            s = _bmm(qt, kb.reshape(NT * H, K, D).transpose(1, 2), ch).float()       # [NT*H, Q, K]
            kpos = torch.arange(b * K, (b + 1) * K, device=q.device)
            allowed = (kpos[None, None, :] <= tp.q_pos[:, :, None])                  # [NT, Q, K]
            s = s.view(NT, H, Q, K).masked_fill(~allowed[:, None], float("-inf")).view(NT * H, Q, K)
            m_new = torch.maximum(m, s.amax(-1))                                     # [NT*H, Q]
            p = torch.exp(s - m_new[..., None]).to(q.dtype)                          # masked -> 0
            vaug = torch.cat([vb, ones], dim=-1).reshape(NT * H, K, D + 1)           # [NT*H, K, D+1]
            acc = acc * torch.exp(m - m_new)[..., None] + _bmm(p, vaug, ch).float()
            m = m_new
        o = (acc[..., :D] / acc[..., D:]).to(q.dtype).view(NT, H, Q, D).transpose(1, 2)  # [NT, Q, H, D]
        return o.reshape(NT * Q, H * D)[tp.out_index]
