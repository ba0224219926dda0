"""KV events: what entered or left a cache, one entry per page, keyed by a chained block hash.

A page's hash chains on its parent page's hash, its token ids and the namespace, so the same
tokens under two namespaces never hash alike. Consumers (routers, KV-aware load balancers)
rebuild a replica's cache contents from these events.
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Iterable, Literal, NamedTuple

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


def chain_hashes(parent: int | None, namespace: tuple, pages: list[bytes], algo: str = "sha256",
                 first: tuple | None = None) -> list[int]:
    """chain_hash down a run of pages, each chained on the one before (the first on `parent`):
    the same values, each looked up in the process's memo first. The first page mixes in
    `first` instead of `namespace` when given (a block chain salts its first block only)."""
    out: list[int] = []
    if first is not None and pages:
        parent = _memo(parent, first, pages[0], algo)
        out.append(parent)
        pages = pages[1:]
    ns = _namespace_bytes(namespace)
    lead, zero, sha, memo = (8 + len(ns)).to_bytes(4, "little"), b"\x00" * 8, algo == "sha256", _MEMO
    for page in pages:
        k = (parent, namespace, page, algo)
        h = memo.get(k)
        if h is None:
            payload = lead + (zero if parent is None else parent.to_bytes(8, "little")) + ns + page
            h = (int.from_bytes(hashlib.sha256(payload).digest()[:8], "little") if sha
                 else xxhash.xxh3_64_intdigest(payload))
            if len(memo) >= _MEMO_MAX:
                memo.clear()
            memo[k] = h
        out.append(h)
        parent = h
    return out


def _memo(parent: int | None, namespace: tuple, page: bytes, algo: str) -> int:
    k = (parent, namespace, page, algo)
    h = _MEMO.get(k)
    if h is None:
        h = chain_hash(*k)
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[k] = h
    return h


# Chained page hashes computed in this process, by (parent, namespace, page bytes, algorithm):
# a prefix many prompts share is hashed once, and in a simulated cluster the pages a router
# hashed to route a prompt are looked up, not hashed again, when a replica's cache stores them.
# Bounded: cleared when full. 32 Ki entries (~7 MB at one token a page) cover the pages of the
# requests in flight of an 8-replica Mooncake run as fast as 256 Ki did, and keep a long-running
# server's resident memory flat after its first minute.
_MEMO: dict[tuple, int] = {}
_MEMO_MAX = 1 << 15


class KVEvent(NamedTuple):
    """One page entering or leaving a cache (immutable; a tuple, so making one is cheap: a
    stored run records one per block)."""
    kind: Literal["stored", "removed", "cleared"]
    block_hash: int | None = None        # None for "cleared"
    parent_hash: int | None = None       # "stored" only; None for a first page
    token_ids: tuple[int, ...] = ()      # "stored" only
    namespace: tuple = (None, None)


def removed_events(hashes: Iterable[int], namespace: tuple = (None, None)) -> list[KVEvent]:
    """A "removed" event per hash, made at tuple speed (an eviction removes many at once)."""
    return [new_event(KVEvent, ("removed", h, None, (), namespace)) for h in hashes]


# new_event(KVEvent, (kind, block_hash, parent_hash, token_ids, namespace)): a KVEvent made at
# tuple speed, skipping the keyword handling (a stored run or an eviction makes many)
new_event = tuple.__new__
