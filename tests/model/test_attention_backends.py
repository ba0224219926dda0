"""Attention backends: chosen by name, numerically interchangeable, and the batch-invariant one
gives a token bit-identical K/V and logits whatever forward computes it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radixkv.engine.executor import BatchPlan, Segment
from radixkv.model.attention import (ATTENTION_BACKENDS, AttentionBackend, BatchInvariantBackend,
                                     attention_backend)
from radixkv.model.executor import TorchExecutor
from radixkv.model.kv_pool import AttnBatch, KVPool
from radixkv.model.model import Transformer
from radixkv.shapes import ModelArgs, get_model_config

ATOL, RTOL = 1e-5, 1e-5
CONFIGS = {
    "tiny-llama": get_model_config("tiny-llama"),
    "gqa-scaled": ModelArgs("gqa-scaled", vocab_size=259, dim=128, n_layers=2, n_heads=8,
                            n_kv_heads=2, intermediate_size=256, rope_theta=500000.0,
                            rope_scaling=(8.0, 1.0, 4.0, 64)),
}
# Small tiles and blocks, so short sequences span several of each.
SMALL = {"tile": 8, "q_tile": 4, "block": 16, "bmm_chunk": 4}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request) -> Transformer:
    return Transformer(CONFIGS[request.param]).init_random(seed=1, std=0.05).eval()


def tokens(n: int, seed: int, vocab: int = 259) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def forward(model, backend: AttentionBackend, kv: KVPool, prefix_lens, ctx, new) -> list[torch.Tensor]:
    """One packed forward; each sequence's all-new-token logits [n_new, V]."""
    batch = backend.plan(prefix_lens, ctx)
    with torch.no_grad():
        out = model(torch.cat(new), batch.positions, kv, batch, return_all=True)
    return list(out.split(list(batch.n_new)))


# ---- the registry ------------------------------------------------------------------------------
def test_registry_names_both_backends():
    assert {"sdpa", "batch-invariant"} <= set(ATTENTION_BACKENDS.names())
    for name in ATTENTION_BACKENDS:
        assert attention_backend(name).name == name


def test_unknown_backend_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'; valid: .*sdpa") as e:
        attention_backend("flash")
    assert "batch-invariant" in str(e.value)
    with pytest.raises(ValueError, match="unknown attention backend 'paged-v2'"):
        TorchExecutor.from_config("tiny-llama", 16, device="cpu", attention="paged-v2")


def test_backend_options_and_selection():
    b = attention_backend("batch-invariant", **SMALL)
    assert (b.tile, b.q_tile, b.block, b.bmm_chunk) == (8, 4, 16, 4)
    assert attention_backend("sdpa", **SMALL).name == "sdpa"     # options it lacks are ignored
    with pytest.raises(ValueError, match="q_tile must be a positive int, got 0"):
        BatchInvariantBackend(q_tile=0)
    assert TorchExecutor.from_config("tiny-llama", 16, device="cpu").attention.name == "sdpa"
    ex = TorchExecutor.from_config("tiny-llama", 16, device="cpu", batch_invariant=True, tile=8)
    assert ex.attention.name == "batch-invariant" and ex.attention.tile == 8 and ex.batch_invariant


def test_invariant_plan_tiles_queries_and_aligns_context():
    # Sequence 0: prefix 2, 5 new -> tiles of 4 rows [2..5], [6, 6 (pad)...]; sequence 1: one tile.
    b = attention_backend("batch-invariant", q_tile=4, block=8).plan([2, 0], [list(range(10, 17)), [3]])
    assert b.q_index.shape == (4, 4) and b.ctx_index.shape == (4, 8)   # 3 tiles, padded to even
    assert b.q_pos.tolist()[:3] == [[2, 3, 4, 5], [6, 6, 6, 6], [0, 0, 0, 0]]
    assert b.ctx_index.tolist()[:3] == [[10, 11, 12, 13, 14, 15, 0, 0],
                                        [10, 11, 12, 13, 14, 15, 16, 0], [3, 0, 0, 0, 0, 0, 0, 0]]
    assert b.out_index.tolist() == [0, 1, 2, 3, 4, 8]
    assert b.mask[1, 0, 0].tolist() == [True] * 7 + [False]


# ---- numerics ------------------------------------------------------------------------------------
def test_backends_agree_on_mixed_batch(model):
    """Cached prefixes of different lengths, then a packed extend: same logits and K/V."""
    args = model.args
    prefix_lens, n_new = [0, 3, 20, 7], [5, 1, 12, 9]
    seqs = [tokens(p + n, seed=10 + i) for i, (p, n) in enumerate(zip(prefix_lens, n_new))]
    lens = [p + n for p, n in zip(prefix_lens, n_new)]
    ctx = np.split(np.random.default_rng(7).permutation(200)[:sum(lens)], np.cumsum(lens)[:-1])
    outs, pools = [], []
    for backend in (attention_backend("sdpa"), attention_backend("batch-invariant", **SMALL)):
        kv = KVPool(args, 200)
        for c, p, s in zip(ctx, prefix_lens, seqs):
            if p:
                forward(model, backend, kv, [0], [c[:p]], [s[:p]])
        new = [s[p:] for s, p in zip(seqs, prefix_lens)]
        outs.append(forward(model, backend, kv, prefix_lens, ctx, new))
        pools.append(kv.buf)
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(pools[1], pools[0], atol=ATOL, rtol=RTOL)
    assert max(o.abs().max() for o in outs[0]) > 1.0


@pytest.mark.parametrize("options", [SMALL, {}], ids=["small-tiles", "defaults"])
def test_invariant_token_is_bit_identical_in_any_batch(model, options):
    """A sequence's logits and K/V computed alone, as chunks after a cached prefix inside
    batches of other sequences, and one decode step at a time: torch.equal throughout."""
    args, backend = model.args, attention_backend("batch-invariant", **options)
    seq = tokens(37, seed=3)
    alone_kv = KVPool(args, 64)
    alone = forward(model, backend, alone_kv, [0], [list(range(37))], [seq])[0]       # [37, V]

    kv = KVPool(args, 512)
    mine = np.random.default_rng(1).permutation(np.arange(200, 512))[:37]    # others use < 200
    others = [tokens(n, seed=20 + n) for n in (11, 2, 29)]
    got = []
    for k, (lo, hi) in enumerate(((0, 13), (13, 30))):      # two chunks, different company each
        company = others[k:] if k else others[:2]
        ctx = [mine[:hi]] + [np.arange(20 * i, 20 * i + len(o)) + 40 * k for i, o in enumerate(company)]
        pl = [lo] + [0] * len(company)
        got.append(forward(model, backend, kv, pl, ctx, [seq[lo:hi]] + company)[0])
    for t in range(30, 37):                                  # decode, alongside one other sequence
        ctx = [mine[:t + 1], np.arange(150, 150 + t - 26)]
        got.append(forward(model, backend, kv, [t, 0], ctx, [seq[t:t + 1], tokens(t - 26, seed=t)])[0])
    assert torch.equal(torch.cat(got), alone)
    for layer in range(args.n_layers):
        cached = kv.gather(layer, torch.from_numpy(mine))                    # (K, V) of the sequence
        assert all(map(torch.equal, cached, alone_kv.gather(layer, torch.arange(37))))


def test_plan_without_backend_runs_on_sdpa(model):
    args, seq = model.args, tokens(9, seed=4)
    plain = AttnBatch.build([0], [list(range(9))])
    assert plain.backend is None
    sdpa = attention_backend("sdpa").plan([0], [list(range(9))])
    with torch.no_grad():
        a = model(seq, plain.positions, KVPool(args, 16), plain)
        b = model(seq, sdpa.positions, KVPool(args, 16), sdpa)
    assert torch.equal(a, b)


def test_invariant_plan_rejects_position_past_max_seq_len():
    args = CONFIGS["gqa-scaled"].with_(max_seq_len=8)
    model = Transformer(args).init_random(0)
    with pytest.raises(ValueError, match="position 9 exceeds max_seq_len 8"):
        forward(model, attention_backend("batch-invariant"), KVPool(args, 16), [0],
                [list(range(10))], [tokens(10, seed=0)])


# ---- the executor ----------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_invariant", [False, True])
def test_executor_calls_the_model_once_per_step(batch_invariant):
    ex = TorchExecutor.from_config("tiny-llama", 64, device="cpu", batch_invariant=batch_invariant)
    calls = []
    forward_ = ex.model.forward
    ex.model.forward = lambda *a, **kw: calls.append(a[3]) or forward_(*a, **kw)

    class R:
        rid, sampling = "x", None
    plan = BatchPlan(extends=[Segment(R(), 0, [1, 2, 3], np.arange(3), True),
                              Segment(R(), 0, [4, 5], np.arange(10, 12), False)])
    res = ex.run(plan)
    assert len(calls) == 1 and calls[0].backend is ex.attention and res.tokens[1] is None
