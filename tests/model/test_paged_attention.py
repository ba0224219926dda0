"""Paged-KV forward: cached-prefix extend, batching and decode all equal a full recompute."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radixkv.model.kv_pool import AttnBatch, KVPool
from radixkv.model.model import Transformer
from radixkv.shapes import ModelArgs, get_model_config

ATOL, RTOL = 1e-5, 1e-5      # torch.allclose defaults; fp32 matmul blocking differs by shape
CONFIGS = {
    "tiny-llama": get_model_config("tiny-llama"),
    "gqa-scaled": ModelArgs("gqa-scaled", vocab_size=259, dim=128, n_layers=2, n_heads=8,
                            n_kv_heads=2, intermediate_size=256, rope_theta=500000.0,
                            rope_scaling=(8.0, 1.0, 4.0, 64)),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request) -> Transformer:
    # std 0.05 keeps logits O(1), so the fp32 tolerances below are meaningful yet robust.
    return Transformer(CONFIGS[request.param]).init_random(seed=1, std=0.05).eval()


def run(model: Transformer, kv: KVPool, prefix_lens: list[int], ctx_slots: list[list[int]],
        new_tokens: list[torch.Tensor]) -> list[torch.Tensor]:
    """One batched forward; returns each sequence's all-new-token logits [n_new, V]."""
    batch = AttnBatch.build(prefix_lens, ctx_slots)
    with torch.no_grad():
        out = model(torch.cat(new_tokens), batch.positions, kv, batch, return_all=True)
    return list(out.split(list(batch.n_new)))


def shuffled_slots(n: int, num_slots: int, seed: int) -> list[int]:
    """n distinct, non-contiguous slots in random order."""
    return np.random.default_rng(seed).permutation(num_slots)[:n].tolist()


def tokens(n: int, seed: int, vocab: int = 259) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_extend_after_cached_prefix_equals_full(model):
    args, seq = model.args, tokens(40, seed=0)
    full = run(model, KVPool(args, 64), [0], [list(range(40))], [seq])[0]
    kv = KVPool(args, 256)
    slots = shuffled_slots(40, 256, seed=3)
    pre = run(model, kv, [0], [slots[:25]], [seq[:25]])[0]
    ext = run(model, kv, [25], [slots], [seq[25:]])[0]
    torch.testing.assert_close(pre, full[:25], atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(ext, full[25:], atol=ATOL, rtol=RTOL)
    assert full.abs().max() > 1.0  # logits large enough for the tolerance to mean something


def test_cached_kv_bytes_equal_recomputed(model):
    args, seq = model.args, tokens(12, seed=1)
    kv_a, kv_b = KVPool(args, 32), KVPool(args, 32)
    run(model, kv_a, [0], [list(range(12))], [seq])
    slots = shuffled_slots(12, 32, seed=5)
    run(model, kv_b, [0], [slots[:7]], [seq[:7]])
    run(model, kv_b, [7], [slots], [seq[7:]])
    for layer in range(args.n_layers):
        ka, va = kv_a.gather(layer, torch.arange(12))
        kb, vb = kv_b.gather(layer, torch.tensor(slots))
        torch.testing.assert_close(kb, ka, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(vb, va, atol=ATOL, rtol=RTOL)


def test_batched_extend_with_mixed_prefixes_equals_each_alone(model):
    args = model.args
    prefix_lens, n_new = [0, 3, 20, 7], [5, 1, 12, 9]
    seqs = [tokens(p + n, seed=10 + i) for i, (p, n) in enumerate(zip(prefix_lens, n_new))]
    all_slots = shuffled_slots(sum(prefix_lens) + sum(n_new), 200, seed=7)
    ctx, off = [], 0
    for p, n in zip(prefix_lens, n_new):
        ctx.append(all_slots[off:off + p + n])
        off += p + n
    kv = KVPool(args, 200)
    for c, p, s in zip(ctx, prefix_lens, seqs):
        if p:
            run(model, kv, [0], [c[:p]], [s[:p]])
    batched = run(model, kv, prefix_lens, ctx, [s[p:] for s, p in zip(seqs, prefix_lens)])
    for i, (s, p) in enumerate(zip(seqs, prefix_lens)):
        alone = run(model, KVPool(args, 64), [0], [list(range(len(s)))], [s])[0]
        torch.testing.assert_close(batched[i], alone[p:], atol=ATOL, rtol=RTOL)


def test_batched_decode_steps_equal_full_recompute(model):
    args = model.args
    prompts = [tokens(n, seed=20 + i) for i, n in enumerate([4, 11, 7])]
    steps = [tokens(5, seed=30 + i) for i in range(3)]    # fixed decode inputs per sequence
    kv = KVPool(args, 128)
    free = shuffled_slots(128, 128, seed=9)
    ctx = [[free.pop() for _ in p] for p in prompts]
    run(model, kv, [0, 0, 0], ctx, prompts)
    for t in range(5):
        for c in ctx:
            c.append(free.pop())
        batch = AttnBatch.build([len(c) - 1 for c in ctx], ctx)
        ids = torch.stack([s[t] for s in steps])
        with torch.no_grad():
            last = model(ids, batch.positions, kv, batch)                      # [3, V]
        for i, (p, s) in enumerate(zip(prompts, steps)):
            seq = torch.cat([p, s[:t + 1]])
            ref = run(model, KVPool(args, 64), [0], [list(range(len(seq)))], [seq])[0][-1]
            torch.testing.assert_close(last[i], ref, atol=ATOL, rtol=RTOL)


def test_last_token_logits_match_return_all(model):
    args = model.args
    seqs = [tokens(n, seed=40 + n) for n in (3, 8, 1)]
    ctx = [list(range(0, 3)), list(range(10, 18)), [30]]
    kv = KVPool(args, 32)
    batch = AttnBatch.build([0, 0, 0], ctx)
    with torch.no_grad():
        last = model(torch.cat(seqs), batch.positions, kv, batch)
    every = run(model, KVPool(args, 32), [0, 0, 0], ctx, seqs)
    torch.testing.assert_close(last, torch.stack([e[-1] for e in every]), atol=ATOL, rtol=RTOL)


def test_attn_batch_layout_and_mask():
    b = AttnBatch.build([2, 0], [[7, 3, 9, 4], [5]])
    assert b.prefix_lens == (2, 0) and b.n_new == (2, 1)
    assert b.new_slots.tolist() == [9, 4, 5]
    assert b.positions.tolist() == [2, 3, 0]
    assert b.ctx_index.tolist() == [[7, 3, 9, 4], [5, 0, 0, 0]]
    assert b.q_index.tolist() == [[0, 1], [2, 2]]
    assert b.out_index.tolist() == [0, 1, 2]
    assert b.last_index.tolist() == [1, 2]
    assert b.max_slot == 9
    assert b.mask[:, 0].tolist() == [
        [[True, True, True, False], [True, True, True, True]],
        [[True, False, False, False], [True, False, False, False]],   # row 1 is padding
    ]


@pytest.mark.parametrize("prefix_lens, ctx, match", [
    ([3], [[1, 2, 3]], "prefix_len 3"),
    ([-1], [[1, 2]], "prefix_len -1"),
    ([0, 0], [[1]], "2 prefix_lens but 1"),
    ([0], [[1, -4]], "negative slot -4"),
    ([0, 1], [[1, 2], [3, 2]], "new slot 2 is written twice"),
    ([], [], "empty batch"),
])
def test_attn_batch_rejects_bad_input(prefix_lens, ctx, match):
    with pytest.raises(ValueError, match=match):
        AttnBatch.build(prefix_lens, ctx)


def test_forward_rejects_slots_outside_pool_and_length_mismatch():
    args = CONFIGS["gqa-scaled"]
    model = Transformer(args).init_random(0)
    batch = AttnBatch.build([0], [[0, 8]])
    with pytest.raises(ValueError, match="slot 8 is outside the KV pool of 8 slots"):
        model(torch.tensor([1, 2]), batch.positions, KVPool(args, 8), batch)
    with pytest.raises(ValueError, match="3 input ids"):
        model(torch.tensor([1, 2, 3]), torch.arange(3), KVPool(args, 16), batch)


def test_kv_pool_sizes():
    args = get_model_config("tiny-llama")
    kv = KVPool(args, 10, dtype=torch.bfloat16)
    assert kv.buf.shape == (2, 2, 10, 2, 64)
    assert kv.bytes_per_token == args.kv_bytes_per_token(2) == 2 * 2 * 2 * 64 * 2
    assert kv.nbytes == 10 * kv.bytes_per_token
    with pytest.raises(ValueError, match="num_slots must be a positive int, got 0"):
        KVPool(args, 0)


def test_init_random_is_deterministic():
    args = CONFIGS["gqa-scaled"]
    a, b = Transformer(args).init_random(5), Transformer(args).init_random(5)
    c = Transformer(args, dtype=torch.float64).init_random(5)
    for (n, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), n
        assert torch.equal(pa, pc.float()), n
    d = Transformer(args).init_random(6)
    assert not torch.equal(a.output.weight, d.output.weight)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    args = CONFIGS["gqa-scaled"]
    seqs = [tokens(n, seed=50 + n) for n in (6, 13)]
    ctx = [list(range(6)), list(range(20, 33))]
    outs = []
    for dev in ("cpu", "cuda"):
        m = Transformer(args, device=dev).init_random(2, std=0.1).eval()
        batch = AttnBatch.build([0, 0], ctx, device=dev)
        with torch.no_grad():
            outs.append(m(torch.cat(seqs).to(dev), batch.positions, KVPool(args, 40, dev), batch).cpu())
    torch.testing.assert_close(outs[1], outs[0], atol=1e-3, rtol=0)
