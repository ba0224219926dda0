"""KVPool.gather against plain advanced indexing of the buffer, on any slot shape and layout."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from radixkv.model.kv_pool import KVPool  # noqa: E402
from radixkv.shapes import get_model_config  # noqa: E402


@pytest.mark.parametrize("shape", [(7,), (3, 11), (2, 4, 5)])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "scattered", "repeated"])
def test_gather_is_the_indexed_buffer(shape, layout):
    args = get_model_config("tiny-llama")
    kv = KVPool(args, 512)
    kv.buf.copy_(torch.randn(kv.buf.shape))
    n, rng = int(np.prod(shape)), np.random.default_rng(1)
    flat = {"contiguous": np.arange(40, 40 + n), "strided": np.arange(3, 3 + 3 * n, 3),
            "scattered": rng.choice(512, n, replace=False), "repeated": rng.integers(0, 4, n)}[layout]
    slots = torch.from_numpy(flat.reshape(shape))
    for layer in range(args.n_layers):
        k, v = kv.gather(layer, slots)
        assert k.shape == v.shape == (*shape, args.n_kv_heads, args.head_dim)
        assert torch.equal(k, kv.buf[0, layer][slots]) and torch.equal(v, kv.buf[1, layer][slots])
