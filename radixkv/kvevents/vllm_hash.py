"""Block hashes as vLLM computes them (v1's prefix cache, 0.32), so a gateway in front of vLLM
workers finds a prompt's blocks among those the workers' KV events announce.

vLLM hashes block i of a prompt as H((parent, token ids, extra keys)): `parent` the digest of
block i-1 (for the first block NONE_HASH = H(seed), the seed "vllm-none-hash" unless the
engine's PYTHONHASHSEED was set), the block's token ids as a tuple of ints, `extra keys` None or
a tuple (the request's cache_salt on the first block as ("cache_salt", salt); LoRA, images and
prompt embeddings add theirs). H serialises the triple and takes SHA-256:

    vllm-sha256        pickle (the highest protocol, 5)   --prefix-caching-hash-algo sha256
    vllm-sha256-cbor   canonical CBOR                      --prefix-caching-hash-algo sha256_cbor

Digests chain whole (32 bytes); the events carry each as an int, its low 64 bits read
big-endian (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default). vLLM's xxhash schemes seed
NONE_HASH with random bytes per process unless PYTHONHASHSEED is set, so no other program can
compute them: they are not offered here.
"""
from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from functools import lru_cache

import cbor2

from radixkv.argcheck import choice

# what a gateway names each scheme, and what vLLM's --prefix-caching-hash-algo calls it
VLLM_SCHEMES = {"vllm-sha256": "sha256", "vllm-sha256-cbor": "sha256_cbor"}
DEFAULT_SEED = "vllm-none-hash"        # vLLM's NONE_HASH seed without PYTHONHASHSEED
_LOW64 = (1 << 64) - 1
_PICKLE = 5


def scheme_of(engine_algo: str) -> str | None:
    """The scheme of a vLLM worker reporting `--prefix-caching-hash-algo` `engine_algo` (its
    `vllm:cache_config_info` label), or None where no other program can compute its hashes."""
    return next((s for s, a in VLLM_SCHEMES.items() if a == engine_algo), None)


def _digest(scheme: str, obj) -> bytes:
    data = (pickle.dumps(obj, protocol=_PICKLE) if scheme == "vllm-sha256"
            else cbor2.dumps(obj, canonical=True))
    return hashlib.sha256(data).digest()


@lru_cache(maxsize=16)
def none_hash(scheme: str, seed: str = DEFAULT_SEED) -> bytes:
    """The parent digest of a prompt's first block."""
    return _digest(choice(scheme, "vLLM hash scheme", VLLM_SCHEMES), seed)


def to_int(digest: bytes) -> int:
    """A block digest as vLLM's events carry it: its low 64 bits, read big-endian."""
    return int.from_bytes(digest[-8:], "big")


def chain(scheme: str, parent: bytes | None, blocks: Sequence[Sequence[int]],
          first_extra: tuple | None = None, seed: str = DEFAULT_SEED) -> list[bytes]:
    """The digests of `blocks` (each a block's token ids), the first chained on `parent` (None:
    the prompt's first block, chained on NONE_HASH) with `first_extra` as its extra keys, the
    others with none."""
    choice(scheme, "vLLM hash scheme", VLLM_SCHEMES)
    out: list[bytes] = []
    prev = none_hash(scheme, seed) if parent is None else parent
    extra = first_extra
    for ids in blocks:
        prev = _digest(scheme, (prev, tuple(ids), extra))
        out.append(prev)
        extra = None
    return out


def first_extra(cache_salt: str | None) -> tuple | None:
    """The extra keys of a prompt's first block for a request with `cache_salt` (no LoRA, no
    images, no prompt embeddings)."""
    return (("cache_salt", cache_salt),) if cache_salt else None


def block_hashes(tokens: Sequence[int], block_size: int, scheme: str = "vllm-sha256",
                 cache_salt: str | None = None, seed: str = DEFAULT_SEED) -> list[int]:
    """The event hashes (ints) of the whole blocks of a prompt of `tokens`, as a vLLM worker of
    `block_size` announces them when it stores the prompt."""
    n = len(tokens) // block_size
    blocks = [tokens[i * block_size:(i + 1) * block_size] for i in range(n)]
    return [to_int(d) for d in chain(scheme, None, blocks, first_extra(cache_salt), seed)]
