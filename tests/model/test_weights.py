"""HF checkpoint save/load: round trips, shards, config parsing and error messages."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from radixkv.model.model import Transformer
from radixkv.shapes import ModelArgs, get_model_config
from radixkv.model.weights import (args_from_hf_config, hf_config_from_args, load_hf_checkpoint,
                                   save_hf_checkpoint)

ARGS = ModelArgs("w", vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                 intermediate_size=48, rope_scaling=(8.0, 1.0, 4.0, 8192), bos_id=1, eos_id=2)


@pytest.fixture()
def ckpt(tmp_path):
    model = Transformer(ARGS).init_random(0)
    save_hf_checkpoint(model, ARGS, tmp_path / "ck")
    return model, tmp_path / "ck"


def assert_same_weights(a: Transformer, b: Transformer) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k].to(sa[k].dtype)), k


def test_round_trip_single_file(ckpt):
    model, path = ckpt
    assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors"]
    loaded, args = load_hf_checkpoint(path)
    assert args == ARGS.with_(name="ck")
    assert_same_weights(model, loaded)


def test_round_trip_sharded(tmp_path):
    model = Transformer(ARGS).init_random(1)
    save_hf_checkpoint(model, ARGS, tmp_path, max_shard_bytes=20_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((tmp_path / s).is_file() for s in shards)
    assert index["metadata"]["total_size"] == sum(p.numel() * 4 for p in model.parameters())
    loaded, _ = load_hf_checkpoint(tmp_path)
    assert_same_weights(model, loaded)


def test_shards_without_index_are_found_by_glob(tmp_path):
    model = Transformer(ARGS).init_random(2)
    save_hf_checkpoint(model, ARGS, tmp_path, max_shard_bytes=20_000)
    (tmp_path / "model.safetensors.index.json").unlink()
    assert_same_weights(model, load_hf_checkpoint(tmp_path)[0])


def test_tied_embeddings_round_trip(tmp_path):
    args = ARGS.with_(tie_embeddings=True)
    save_hf_checkpoint(Transformer(args).init_random(3), args, tmp_path)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    loaded, _ = load_hf_checkpoint(tmp_path)
    assert loaded.output.weight is loaded.tok_embeddings.weight


def test_qkv_bias_round_trip_and_dtype(tmp_path):
    args = ARGS.with_(qkv_bias=True, rope_scaling=None)
    model = Transformer(args).init_random(4)
    save_hf_checkpoint(model, args, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    assert "model.layers.1.self_attn.k_proj.bias" in load_file(tmp_path / "model.safetensors")
    loaded, loaded_args = load_hf_checkpoint(tmp_path, dtype=torch.bfloat16)
    assert loaded_args.qkv_bias and loaded.output.weight.dtype == torch.bfloat16
    torch.testing.assert_close(loaded.layers[1].attention.wqkv.bias.float(),
                               model.layers[1].attention.wqkv.bias, atol=1e-2, rtol=1e-2)


def test_llama31_and_qwen2_release_configs_parse_to_named_shapes():
    llama31 = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
               "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
               "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
               "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
               "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
               "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}
    assert args_from_hf_config(llama31, name="llama-3.1-8b") == get_model_config("llama-3.1-8b")
    qwen2 = {"model_type": "qwen2", "vocab_size": 152064, "hidden_size": 3584,
             "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
             "rope_theta": 1000000.0, "use_sliding_window": False, "tie_word_embeddings": False,
             "bos_token_id": 151643, "eos_token_id": 151643}
    assert args_from_hf_config(qwen2, name="qwen2-7b") == get_model_config("qwen2-7b").with_(
        bos_id=151643, eos_id=151643)


def test_config_rewritten_by_transformers_v5_parses_back(ckpt, tmp_path):
    transformers = pytest.importorskip("transformers")
    _, path = ckpt
    transformers.AutoConfig.from_pretrained(path).save_pretrained(tmp_path / "re")
    cfg = json.loads((tmp_path / "re" / "config.json").read_text())
    assert args_from_hf_config(cfg, name=ARGS.name) == ARGS


def test_config_round_trip():
    for args in (ARGS, ARGS.with_(qkv_bias=True, tie_embeddings=True, rope_scaling=None)):
        assert args_from_hf_config(hf_config_from_args(args), name=args.name) == args


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        load_hf_checkpoint(tmp_path / "nope")


def test_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no config.json in checkpoint directory '{tmp_path}'"):
        load_hf_checkpoint(tmp_path)


def test_malformed_config(ckpt):
    _, path = ckpt
    (path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"ck/config.json: malformed JSON"):
        load_hf_checkpoint(path)
    (path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object, got list"):
        load_hf_checkpoint(path)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.pop("hidden_size"), "config.json: missing required key 'hidden_size'"),
    (lambda c: c.update(model_type="gpt2"), "unsupported model_type 'gpt2'"),
    (lambda c: c.update(hidden_act="gelu"), "unsupported hidden_act 'gelu'"),
    (lambda c: c["rope_scaling"].update(rope_type="yarn"), "unsupported rope_type 'yarn'"),
    (lambda c: c["rope_scaling"].pop("factor"), "llama3 rope scaling lacks 'factor'"),
    (lambda c: c.update(num_key_value_heads=3), "n_heads 4 is not divisible by n_kv_heads 3"),
    (lambda c: c.update(head_dim=16), "head_dim 16"),
])
def test_bad_config_values(ckpt, edit, match):
    _, path = ckpt
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=match):
        load_hf_checkpoint(path)


def test_no_weight_files(ckpt):
    _, path = ckpt
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no \*.safetensors files in checkpoint directory"):
        load_hf_checkpoint(path)


def test_index_names_a_missing_shard(tmp_path):
    save_hf_checkpoint(Transformer(ARGS).init_random(0), ARGS, tmp_path, max_shard_bytes=20_000)
    shard = sorted(tmp_path.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=f"shard '{shard.name}' is missing"):
        load_hf_checkpoint(tmp_path)


def test_malformed_index(ckpt):
    _, path = ckpt
    (path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ValueError, match="model.safetensors.index.json: malformed index"):
        load_hf_checkpoint(path)


def test_missing_unexpected_and_misshapen_tensors(ckpt, tmp_path):
    _, path = ckpt
    tensors = load_file(path / "model.safetensors")
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    name = "model.layers.1.mlp.up_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, bad / "model.safetensors")
    with pytest.raises(ValueError, match=f"lacks 1 tensors, e.g. \\['{name}'\\]"):
        load_hf_checkpoint(bad)
    save_file({**tensors, "model.extra.weight": torch.zeros(2)}, bad / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected tensors, e.g. \\['model.extra.weight'\\]"):
        load_hf_checkpoint(bad)
    save_file({**tensors, name: torch.zeros(3, 3)}, bad / "model.safetensors")
    with pytest.raises(ValueError, match=f"tensor '{name}' has shape \\(3, 3\\), expected \\(48, 32\\)"):
        load_hf_checkpoint(bad)
