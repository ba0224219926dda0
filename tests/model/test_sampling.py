"""Sampling: validation, greedy, top-k / top-p support, per-request seeded determinism."""
from __future__ import annotations

import math

import pytest
import torch

from radixkv.model.sampling import SamplingParams, sample

V = 50


def logits_rows(b: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, V, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("kw, match", [
    ({"temperature": -0.5}, "temperature must be a finite number >= 0, got -0.5"),
    ({"temperature": math.inf}, "got inf"),
    ({"temperature": "1"}, "got '1'"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
    ({"top_p": 1.5}, "got 1.5"),
    ({"top_k": -1}, "top_k must be an int >= 0 .*got -1"),
    ({"top_k": 2.0}, "got 2.0"),
    ({"seed": -3}, "seed must be None or an int >= 0, got -3"),
    ({"seed": True}, "got True"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1, got 0"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids must be ints >= 0, got -2"),
    ({"stop_token_ids": "ab"}, "stop_token_ids must be a sequence of ints, got 'ab'"),
])
def test_validation_names_the_bad_value(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_defaults_and_normalisation():
    p = SamplingParams(stop_token_ids=[3, 4])
    assert p.greedy and p.stop_token_ids == (3, 4) and p.make_generator() is None
    assert not SamplingParams(temperature=0.7).greedy
    with pytest.raises(AttributeError):
        p.temperature = 1.0  # frozen


def test_greedy_is_argmax_and_draws_nothing():
    logits = logits_rows(4)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    out = sample(logits, [SamplingParams()] * 4, [g] * 4)
    assert out.dtype == torch.long and out.tolist() == logits.argmax(-1).tolist()
    assert torch.equal(g.get_state(), state)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0, top_k=1, seed=0),
    SamplingParams(temperature=5.0, top_p=1e-6, seed=0),
    SamplingParams(temperature=1e-4, seed=0),
])
def test_degenerate_settings_equal_greedy(params):
    logits = logits_rows(6, seed=2)
    gens = [params.make_generator() for _ in range(6)]
    for _ in range(5):
        assert sample(logits, [params] * 6, gens).tolist() == logits.argmax(-1).tolist()


def test_seeded_requests_are_reproducible_and_batch_independent():
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=1234)
    other = SamplingParams(temperature=0.8, seed=7)
    steps = [logits_rows(1, seed=100 + t)[0] for t in range(20)]

    def alone() -> list[int]:
        g = p.make_generator()
        return [sample(s[None], [p], [g]).item() for s in steps]

    def in_batch() -> list[int]:   # same request at row 1, beside a greedy and a sampled neighbour
        gs = [None, p.make_generator(), other.make_generator()]
        out = []
        for t, s in enumerate(steps):
            batch = torch.stack([logits_rows(1, seed=t)[0], s, logits_rows(1, seed=50 + t)[0]])
            out.append(sample(batch, [SamplingParams(), p, other], gs)[1].item())
        return out

    ref = alone()
    assert ref == alone() == in_batch()
    assert len(set(ref)) > 3    # actually sampling, not stuck on the argmax


def test_top_k_and_top_p_restrict_the_support():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()[None].expand(4000, -1)
    g = torch.Generator().manual_seed(0)

    def support(**kw) -> set[int]:
        p = SamplingParams(temperature=1.0, **kw)
        return set(sample(logits, [p] * 4000, [g] * 4000).tolist())

    assert support() == {0, 1, 2, 3}
    assert support(top_k=2) == {0, 1}
    assert support(top_p=0.75) == {0, 1}
    assert support(top_p=0.85) == {0, 1, 2}
    assert support(top_k=3, top_p=0.99) == {0, 1, 2}


def test_frequencies_follow_the_tempered_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    logits = probs.log()[None].expand(20000, -1)
    g = torch.Generator().manual_seed(1)
    for temp in (1.0, 0.5):
        p = SamplingParams(temperature=temp)
        counts = torch.bincount(sample(logits, [p] * 20000, [g] * 20000), minlength=3).float()
        expect = (probs.log() / temp).softmax(-1)
        torch.testing.assert_close(counts / 20000, expect, atol=0.015, rtol=0)


def test_length_mismatch_is_rejected():
    with pytest.raises(ValueError, match="2 logit rows but 1 SamplingParams"):
        sample(logits_rows(2), [SamplingParams()])
    with pytest.raises(ValueError, match="2 logit rows but 3 generators"):
        sample(logits_rows(2), [SamplingParams()] * 2, [None] * 3)
