"""Named model shapes, shared by the PyTorch model and the cost model (no torch here).

Sources: the config.json of each Hugging Face release (meta-llama/Meta-Llama-3-8B,
meta-llama/Meta-Llama-3-70B, Qwen/Qwen2-7B); tiny-* are our own CPU-sized shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from radixkv.argcheck import positive_int


@dataclass(frozen=True)
class ModelArgs:
    name: str
    vocab_size: int
    dim: int                      # hidden size
    n_layers: int
    n_heads: int
    n_kv_heads: int               # GQA: n_heads % n_kv_heads == 0
    intermediate_size: int        # SwiGLU hidden size
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 8192
    # Llama-3.1 style RoPE scaling: (factor, low_freq_factor, high_freq_factor, original_max_pos) or None
    rope_scaling: tuple[float, float, float, int] | None = None
    qkv_bias: bool = False        # Qwen2 puts a bias on q, k and v
    tie_embeddings: bool = False
    bos_id: int | None = None
    eos_id: int | None = None

    def __post_init__(self):
        for f in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size"):
            positive_int(getattr(self, f), f"ModelArgs.{f}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")

    @cached_property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @cached_property
    def num_params(self) -> int:
        """Parameter count (embeddings and LM head included)."""
        hd = self.head_dim
        attn = self.dim * hd * (self.n_heads * 2 + self.n_kv_heads * 2)   # wq, wo, wk, wv
        if self.qkv_bias:
            attn += hd * (self.n_heads + 2 * self.n_kv_heads)
        mlp = 3 * self.dim * self.intermediate_size
        norms = 2 * self.dim
        embed = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return self.n_layers * (attn + mlp + norms) + embed + self.dim

    @cached_property
    def num_nonembed_params(self) -> int:
        """Parameters that do matmul work per token (the LM head counts; the lookup does not)."""
        return self.num_params - self.vocab_size * self.dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V, every layer: 2 * L * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes

    def with_(self, **kw) -> "ModelArgs":
        return replace(self, **kw)


_LLAMA31_SCALING = (8.0, 1.0, 4.0, 8192)

MODEL_CONFIGS: dict[str, ModelArgs] = {
    # CPU-sized, random-initialised; vocab 259 = 256 bytes + bos/eos/pad of the byte tokenizer.
    "tiny-llama": ModelArgs("tiny-llama", vocab_size=259, dim=256, n_layers=2, n_heads=4,
                            n_kv_heads=2, intermediate_size=704, rope_theta=10000.0,
                            max_seq_len=16384, bos_id=256, eos_id=257),
    "tiny-llama-4l": ModelArgs("tiny-llama-4l", vocab_size=259, dim=512, n_layers=4, n_heads=8,
                               n_kv_heads=2, intermediate_size=1408, rope_theta=500000.0,
                               max_seq_len=16384, rope_scaling=_LLAMA31_SCALING,
                               bos_id=256, eos_id=257),
    "llama-3-8b": ModelArgs("llama-3-8b", vocab_size=128256, dim=4096, n_layers=32, n_heads=32,
                            n_kv_heads=8, intermediate_size=14336, bos_id=128000, eos_id=128001),
    "llama-3.1-8b": ModelArgs("llama-3.1-8b", vocab_size=128256, dim=4096, n_layers=32,
                              n_heads=32, n_kv_heads=8, intermediate_size=14336,
                              max_seq_len=131072, rope_scaling=_LLAMA31_SCALING,
                              bos_id=128000, eos_id=128001),
    "llama-3-70b": ModelArgs("llama-3-70b", vocab_size=128256, dim=8192, n_layers=80, n_heads=64,
                             n_kv_heads=8, intermediate_size=28672, bos_id=128000, eos_id=128001),
    "qwen2-7b": ModelArgs("qwen2-7b", vocab_size=152064, dim=3584, n_layers=28, n_heads=28,
                          n_kv_heads=4, intermediate_size=18944, rope_theta=1000000.0,
                          norm_eps=1e-6, max_seq_len=32768, qkv_bias=True),
}


def get_model_config(name: str) -> ModelArgs:
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODEL_CONFIGS))}") from None


# the Hugging Face release each named shape is read from: what an engine serving it loads
HF_RELEASES = {"llama-3-8b": "meta-llama/Meta-Llama-3-8B", "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
               "llama-3-70b": "meta-llama/Meta-Llama-3-70B", "qwen2-7b": "Qwen/Qwen2-7B"}
