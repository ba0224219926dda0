"""TorchExecutor: runs a BatchPlan through a real Transformer over a paged KV pool.

All segments of a plan (extends, then decodes) are packed into one forward: input ids
concatenated, the attention backend's plan built from every segment's prefix_len and
ctx_slots (position of new token j of a segment = prefix_len + j), and the model called
once. The last position of every `sample=True` segment is sampled with the request's
SamplingParams (greedy when None) and its own CPU generator, kept across steps until
`release(rid)`.

The attention backend is chosen by name (`attention="sdpa"`, "paged" or "batch-invariant",
see model/attention.py; by default "paged" on CUDA, "sdpa" elsewhere); `batch_invariant=True`
selects "batch-invariant", under which a token's
KV and logits are bit-identical whatever else shares its forward. `tile`, `q_tile`, `block`
and `bmm_chunk` are that backend's options (ignored by backends that do not take them).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from radixkv import env
from radixkv.engine.executor import BatchPlan, StepResult
from radixkv.model.attention import attention_backend, default_backend_name
from radixkv.model.kv_pool import KVPool
from radixkv.model.model import Transformer
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


class TorchExecutor:
    prices_decodes = False          # every step is run and measured

    def __init__(self, model: Transformer, args: ModelArgs, num_slots: int, device=None, dtype=None,
                 batch_invariant: bool = False, tile: int = 64, q_tile: int = 32, block: int = 128,
                 bmm_chunk: int = 16, attention: str | None = None, host_slots: int = 0):
        self.device = resolve_device(device)
        self.dtype = dtype or default_dtype(self.device)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.args = args
        self.kv = KVPool(args, num_slots, self.device, self.dtype)
        # the host tier's buffer (host_slots: its size in tokens); plans carry the copies
        self.host_kv = KVPool(args, host_slots, "cpu", self.dtype) if host_slots else None
        self.name = f"torch:{args.name}@{self.device.type}/{str(self.dtype).removeprefix('torch.')}"
        self.attention = attention_backend(
            attention or ("batch-invariant" if batch_invariant else default_backend_name(self.device)),
            tile=tile, q_tile=q_tile, block=block, bmm_chunk=bmm_chunk)
        self.batch_invariant = self.attention.batch_invariant
        self.generators: dict[str, torch.Generator | None] = {}
        self.keep_logits = False
        self.last_logits: dict[str, Tensor] = {}                  # rid -> [vocab] float32, on CPU
        self.busy_s, self.steps, self.tokens_computed = 0.0, 0, 0

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
        if plan.copies:
            if self.host_kv is None:
                raise ValueError("this plan copies KV to or from a host tier: build the "
                                 "executor with host_slots")
            self.kv.run_copies(self.host_kv, plan.copies)
        if not segs:
            return StepResult([], 0.0)
        t0 = time.perf_counter()
        ids = np.concatenate([np.asarray(s.input_ids, dtype=np.int64) for s in segs])   # [T]
        if ids.min() < 0 or ids.max() >= self.args.vocab_size:
            bad = int(ids[(ids < 0) | (ids >= self.args.vocab_size)][0])
            raise ValueError(f"token id {bad} is outside the model vocabulary "
                             f"[0, {self.args.vocab_size})")
        rows = [i for i, s in enumerate(segs) if s.sample]
        batch = self.attention.plan([s.prefix_len for s in segs], [s.ctx_slots for s in segs],
                                    self.device)
        input_ids = torch.from_numpy(ids).to(self.device)
        with torch.inference_mode():
            logits = self.model(input_ids, batch.positions, self.kv, batch)[rows]       # [R, V]
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
