"""Our paged-pool forward equals Hugging Face transformers on the same checkpoint (fp32)."""
from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from radixkv.model.kv_pool import AttnBatch, KVPool  # noqa: E402
from radixkv.model.model import Transformer, rope_inv_freq  # noqa: E402
from radixkv.shapes import ModelArgs, get_model_config  # noqa: E402
from radixkv.model.weights import load_hf_checkpoint, save_hf_checkpoint  # noqa: E402

ATOL = 1e-4
CONFIGS = {
    "tiny-llama": get_model_config("tiny-llama"),
    # GQA 8:1 and Llama-3.1 scaling with a short original context, so every band is exercised.
    "llama31-gqa": ModelArgs("llama31-gqa", vocab_size=259, dim=128, n_layers=2, n_heads=8,
                             n_kv_heads=1, intermediate_size=320, rope_theta=500000.0,
                             rope_scaling=(8.0, 1.0, 4.0, 64), bos_id=256, eos_id=257),
    "qwen2-tied": ModelArgs("qwen2-tied", vocab_size=300, dim=128, n_layers=2, n_heads=4,
                            n_kv_heads=2, intermediate_size=256, rope_theta=1000000.0,
                            norm_eps=1e-6, qkv_bias=True, tie_embeddings=True),
}
HF_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def pair(request, tmp_path_factory):
    """(ours loaded from the checkpoint, HF model loaded from it, args)."""
    args = CONFIGS[request.param]
    src = Transformer(args).init_random(seed=3, std=0.08)
    with torch.no_grad():   # non-trivial norm weights, so a mis-mapped norm cannot hide
        for name, p in src.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
    path = tmp_path_factory.mktemp(request.param)
    save_hf_checkpoint(src, args, path)
    ours, loaded_args = load_hf_checkpoint(path)
    assert loaded_args.with_(name=args.name) == args
    model_type = "qwen2" if args.qkv_bias else "llama"
    hf = getattr(transformers, HF_CLASS[model_type]).from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    assert hf.config.model_type == model_type
    return ours, hf, args


def ours_logits(model: Transformer, prompts: list[torch.Tensor], start: int = 0) -> list[torch.Tensor]:
    """All-token logits of a packed prefill batch (prefix_len 0) on shuffled slots."""
    n = sum(len(p) for p in prompts)
    perm = torch.randperm(n + 16, generator=torch.Generator().manual_seed(0)).tolist()
    ctx, off = [], 0
    for p in prompts:
        ctx.append(perm[off:off + len(p)])
        off += len(p)
    batch = AttnBatch.build([0] * len(prompts), ctx)
    with torch.no_grad():
        out = model(torch.cat(prompts), batch.positions + start, KVPool(model.args, n + 16), batch,
                    return_all=True)
    return list(out.split(list(batch.n_new)))


def hf_logits(hf, prompt: torch.Tensor, start: int = 0) -> torch.Tensor:
    pos = torch.arange(start, start + len(prompt))[None]
    with torch.no_grad():
        return hf(input_ids=prompt[None], position_ids=pos).logits[0].float()


def prompts_for(args: ModelArgs, lengths=(5, 17, 1, 9)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(0, args.vocab_size, (n,), generator=g) for n in lengths]


def test_all_token_logits_match_hf(pair):
    ours, hf, args = pair
    prompts = prompts_for(args)
    for mine, prompt in zip(ours_logits(ours, prompts), prompts):
        ref = hf_logits(hf, prompt)
        assert ref.abs().max() > 1.0
        torch.testing.assert_close(mine, ref, atol=ATOL, rtol=0)


def test_logits_match_hf_at_large_positions(pair):
    """RoPE (and its Llama-3.1 scaling) far from position 0, via explicit positions."""
    ours, hf, args = pair
    prompts = prompts_for(args, lengths=(6, 3))
    for mine, prompt in zip(ours_logits(ours, prompts, start=5000), prompts):
        torch.testing.assert_close(mine, hf_logits(hf, prompt, start=5000), atol=ATOL, rtol=0)


def test_hf_parsed_the_rope_scaling(pair):
    _, hf, args = pair
    rope = getattr(hf.config, "rope_parameters", None) or getattr(hf.config, "rope_scaling", None) or {}
    assert (rope.get("rope_type") == "llama3") == (args.rope_scaling is not None)


def test_inv_freq_matches_hf_llama3():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    args = CONFIGS["llama31-gqa"]
    cfg = transformers.LlamaConfig(
        hidden_size=args.dim, num_attention_heads=args.n_heads, num_key_value_heads=args.n_kv_heads,
        rope_theta=args.rope_theta, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64})
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    ours = rope_inv_freq(args)
    torch.testing.assert_close(ours, ref.float(), atol=0, rtol=1e-6)
    assert not torch.allclose(ours, rope_inv_freq(args.with_(rope_scaling=None)))
