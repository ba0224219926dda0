"""Hugging Face Llama / Qwen2 checkpoints (local directory) <-> our Transformer.

Layout: config.json plus model.safetensors, or shards listed in model.safetensors.index.json.
q/k/v projections are fused into one `wqkv` here; HF rotary already uses our rotate_half
convention, so no row permutation is needed.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from radixkv.model.model import Transformer
from radixkv.shapes import ModelArgs

_SUPPORTED = {"llama", "qwen2", "mistral"}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)          # stored by some older exports; recomputed here


def _get(cfg: dict[str, Any], key: str, where: str) -> Any:
    if key not in cfg:
        raise ValueError(f"{where}: missing required key {key!r}")
    return cfg[key]


def _rope(cfg: dict[str, Any], where: str) -> tuple[float, tuple[float, float, float, int] | None]:
    """(rope_theta, llama3 scaling) from legacy rope_theta/rope_scaling or v5 rope_parameters."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(params.get("rope_theta") or cfg.get("rope_theta") or 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        raise ValueError(f"{where}: unsupported rope_type {kind!r} (supported: default, llama3)")
    try:
        return theta, (float(params["factor"]), float(params["low_freq_factor"]),
                       float(params["high_freq_factor"]), int(params["original_max_position_embeddings"]))
    except KeyError as e:
        raise ValueError(f"{where}: llama3 rope scaling lacks {e.args[0]!r}") from None


def args_from_hf_config(cfg: dict[str, Any], name: str | None = None, where: str = "config") -> ModelArgs:
    """ModelArgs from a parsed HF config.json; `where` names the source in error messages."""
    model_type = cfg.get("model_type", "llama")
    if model_type not in _SUPPORTED:
        raise ValueError(f"{where}: unsupported model_type {model_type!r} (supported: {sorted(_SUPPORTED)})")
    if cfg.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: unsupported hidden_act {cfg['hidden_act']!r} (need 'silu')")
    if cfg.get("mlp_bias"):
        raise ValueError(f"{where}: mlp_bias=true is not supported")
    if model_type == "llama" and cfg.get("attention_bias"):
        raise ValueError(f"{where}: attention_bias=true (bias on o_proj) is not supported")
    if cfg.get("use_sliding_window"):
        raise ValueError(f"{where}: use_sliding_window=true is not supported")
    dim, heads = int(_get(cfg, "hidden_size", where)), int(_get(cfg, "num_attention_heads", where))
    if cfg.get("head_dim") not in (None, dim // heads):
        raise ValueError(f"{where}: head_dim {cfg['head_dim']} != hidden_size / num_attention_heads")
    theta, scaling = _rope(cfg, where)
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    try:
        return ModelArgs(
            name=name or cfg.get("_name_or_path") or model_type,
            vocab_size=int(_get(cfg, "vocab_size", where)), dim=dim,
            n_layers=int(_get(cfg, "num_hidden_layers", where)), n_heads=heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            intermediate_size=int(_get(cfg, "intermediate_size", where)),
            rope_theta=theta, norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_seq_len=int(cfg.get("max_position_embeddings", 2048)), rope_scaling=scaling,
            qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias")),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            bos_id=cfg.get("bos_token_id"), eos_id=eos)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def hf_config_from_args(args: ModelArgs, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """A config.json dict (legacy rope_theta/rope_scaling keys, read by transformers 4.x and 5.x)."""
    model_type = "qwen2" if args.qkv_bias else "llama"
    cfg: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if args.qkv_bias else "LlamaForCausalLM"],
        "model_type": model_type, "vocab_size": args.vocab_size, "hidden_size": args.dim,
        "intermediate_size": args.intermediate_size, "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim, "hidden_act": "silu", "max_position_embeddings": args.max_seq_len,
        "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta,
        "tie_word_embeddings": args.tie_embeddings, "bos_token_id": args.bos_id,
        "eos_token_id": args.eos_id, "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if model_type == "llama":
        cfg.update(attention_bias=False, mlp_bias=False)
    else:
        cfg.update(use_sliding_window=False, sliding_window=None)
    if args.rope_scaling is not None:
        f, lo, hi, orig = args.rope_scaling
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": f, "low_freq_factor": lo,
                               "high_freq_factor": hi, "original_max_position_embeddings": orig}
    return cfg


def _hf_targets(model: Transformer) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF tensor name, our parameter view): q/k/v are row slices of the fused wqkv."""
    a = model.args
    yield "model.embed_tokens.weight", model.tok_embeddings.weight
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        att, ff = layer.attention, layer.feed_forward
        q, kv = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        for kind in ("weight", "bias") if a.qkv_bias else ("weight",):
            t = getattr(att.wqkv, kind)
            yield p + f"self_attn.q_proj.{kind}", t[:q]
            yield p + f"self_attn.k_proj.{kind}", t[q:q + kv]
            yield p + f"self_attn.v_proj.{kind}", t[q + kv:]
        yield p + "self_attn.o_proj.weight", att.wo.weight
        yield p + "mlp.gate_proj.weight", ff.w1.weight
        yield p + "mlp.up_proj.weight", ff.w3.weight
        yield p + "mlp.down_proj.weight", ff.w2.weight
        yield p + "input_layernorm.weight", layer.attention_norm.weight
        yield p + "post_attention_layernorm.weight", layer.ffn_norm.weight
    yield "model.norm.weight", model.norm.weight
    if not a.tie_embeddings:
        yield "lm_head.weight", model.output.weight


def read_hf_config(directory: str | Path) -> dict[str, Any]:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {str(directory)!r}")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: malformed JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    return cfg


def _weight_files(directory: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: malformed index, need a 'weight_map' object ({e!r})") from None
        files = {name: directory / f for name, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise FileNotFoundError(f"{index}: shard {f.name!r} is missing from {str(directory)!r}")
        return files
    shards = sorted(directory.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors files in checkpoint directory {str(directory)!r}")
    files = {}
    for f in shards:
        with safe_open(str(f), framework="pt") as st:
            files.update({name: f for name in st.keys()})
    return files


@torch.no_grad()
def load_hf_checkpoint(directory: str | Path, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32, name: str | None = None
                       ) -> tuple[Transformer, ModelArgs]:
    """Build a Transformer from a local HF checkpoint directory; tensors copied file by file."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(directory)!r} does not exist")
    args = args_from_hf_config(read_hf_config(directory), name=name or directory.name,
                               where=str(directory / "config.json"))
    files = _weight_files(directory)
    # Allocate without the default init (which is slow for large models), then fill.
    model = Transformer(args, device="meta", dtype=dtype).to_empty(device=device)
    model.tie_weights()
    targets = dict(_hf_targets(model))
    missing = sorted(set(targets) - set(files))
    if missing:
        raise ValueError(f"checkpoint {str(directory)!r} lacks {len(missing)} tensors, e.g. {missing[:3]}")
    unexpected = sorted(n for n in set(files) - set(targets) if not n.endswith(_IGNORED_SUFFIXES))
    if unexpected and not (args.tie_embeddings and unexpected == ["lm_head.weight"]):
        raise ValueError(f"checkpoint {str(directory)!r} has unexpected tensors, e.g. {unexpected[:3]}")
    by_file: dict[Path, list[str]] = {}
    for n in targets:
        by_file.setdefault(files[n], []).append(n)
    for f, names in by_file.items():
        with safe_open(str(f), framework="pt") as st:
            for n in names:
                t, dst = st.get_tensor(n), targets[n]
                if t.shape != dst.shape:
                    raise ValueError(f"{f}: tensor {n!r} has shape {tuple(t.shape)}, "
                                     f"expected {tuple(dst.shape)}")
                dst.copy_(t)
    return model.eval(), args


def save_hf_checkpoint(model: Transformer, args: ModelArgs, directory: str | Path,
                       max_shard_bytes: int | None = None) -> Path:
    """Write config.json and model.safetensors (or shards plus index when max_shard_bytes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {n: t.detach().to("cpu").contiguous().clone() for n, t in _hf_targets(model)}
    dtype = next(iter(tensors.values())).dtype
    (directory / "config.json").write_text(json.dumps(hf_config_from_args(args, dtype), indent=2))
    if max_shard_bytes is None:
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return directory
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for n, t in tensors.items():
        nb = t.numel() * t.element_size()
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][n], size = t, size + nb
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory
