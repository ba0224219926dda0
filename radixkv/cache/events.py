"""KV events: what entered or left a cache, one entry per page, keyed by a chained block hash.

A page's hash chains on its parent page's hash, its token ids and the namespace, so the same
tokens under two namespaces never hash alike. Consumers (routers, KV-aware load balancers)
rebuild a replica's cache contents from these events.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from dataclasses import dataclass
from typing import Literal

import xxhash

from radixkv.validate import choice

HASH_ALGOS = ("sha256", "xxhash")


def check_hash_algo(name: str) -> str:
    return choice(name, "hash", HASH_ALGOS)


@lru_cache(maxsize=4096)
def _namespace_bytes(namespace: tuple) -> bytes:
    # JSON with explicit nulls: ("bc", "a") and ("c", "ab") encode differently
    return json.dumps(list(namespace), separators=(",", ":")).encode()


def chain_hash(parent: int | None, namespace: tuple, packed_tokens: bytes, algo: str = "sha256") -> int:
    """64-bit block hash of (parent hash, namespace, packed uint32 token ids)."""
    head = (b"\x00" * 8 if parent is None else parent.to_bytes(8, "little")) + _namespace_bytes(namespace)
    payload = len(head).to_bytes(4, "little") + head + packed_tokens
    if algo == "sha256":
        return int.from_bytes(hashlib.sha256(payload).digest()[:8], "little")
    return xxhash.xxh3_64_intdigest(payload)      # algo was checked where it was configured


@dataclass(frozen=True, slots=True)
class KVEvent:
    kind: Literal["stored", "removed", "cleared"]
    block_hash: int | None = None        # None for "cleared"
    parent_hash: int | None = None       # "stored" only; None for a first page
    token_ids: tuple[int, ...] = ()      # "stored" only
    namespace: tuple = (None, None)
