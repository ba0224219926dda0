"""The paged (flex_attention) backend against the reference sdpa backend: same logits for
prefill over a shared cached prefix, chunked extends and decodes, on scattered pool slots."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from radixkv.model.attention import ATTENTION_BACKENDS, attention_backend, default_backend_name
from radixkv.model.kv_pool import KVPool
from radixkv.model.model import Transformer
from radixkv.shapes import get_model_config

pytest.importorskip("torch.nn.attention.flex_attention")
ARGS = get_model_config("tiny-llama")


def run(backend: str, steps) -> list[torch.Tensor]:
    model = Transformer(ARGS).init_random(0).eval()
    kv, be, out = KVPool(ARGS, 700), attention_backend(backend), []
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")                    # eager flex_attention's notice
        for prefix_lens, ctxs, seed in steps:
            b = be.plan(prefix_lens, ctxs)
            ids = torch.from_numpy(np.random.default_rng(seed).integers(0, ARGS.vocab_size,
                                                                         b.num_tokens))
            out.append(model(ids, b.positions, kv, b, return_all=True))
    return out


def test_paged_matches_sdpa_on_shared_and_scattered_slots():
    perm = np.random.default_rng(3).permutation(700)
    shared, a, c = perm[:50], perm[50:90], perm[100:300]
    steps = [([0, 0], [np.concatenate([shared, a[:1]]), c], 1),              # prefill two
             ([50, 20, 200], [np.concatenate([shared, a[1:31]]),               # extend on a cached
                              np.concatenate([shared[:20], perm[400:405]]),   # prefix (shared by
                              np.concatenate([c, perm[500:501]])], 2),        # two) + a decode
             ([81, 201], [np.concatenate([shared, a[:1], a[1:31], perm[600:601]]),
                          np.concatenate([c, perm[500:502]])], 3)]           # two decodes
    for ref, got in zip(run("sdpa", steps), run("paged", steps)):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_registered_and_chosen_on_cuda_only():
    assert {"sdpa", "batch-invariant", "paged"} <= set(ATTENTION_BACKENDS.names())
    assert default_backend_name("cuda") == "paged" and default_backend_name("cpu") == "sdpa"
    with pytest.raises(ValueError, match="kv_block"):
        attention_backend("paged", kv_block=0)


def test_regression_block_mask_built_once_per_forward(monkeypatch):
    """The block mask (with its [tiles, pool] slot map) was rebuilt by every layer."""
    from radixkv.model.attention import PagedBackend
    built = []
    real = PagedBackend._block_mask
    monkeypatch.setattr(PagedBackend, "_block_mask",
                        lambda self, *a: built.append(1) or real(self, *a))
    steps = [([0], [np.arange(30)], 1), ([30], [np.arange(31)], 2)]
    run("paged", steps)
    assert ARGS.n_layers > 1 and len(built) == len(steps)
