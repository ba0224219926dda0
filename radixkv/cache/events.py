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

from radixkv.cache.key import TOKEN_BYTES, RadixKey, token_struct
from radixkv.cache.sim_hash import SIM_HASH, sim64_chain
from radixkv.argcheck import choice

HASH_ALGOS = ("sha256", "xxhash")            # what a user chooses: hashes the peers publish too
EVENT_HASHES = HASH_ALGOS + (SIM_HASH,)      # and the in-process one (cache/sim_hash.py)


def check_hash_algo(name: str) -> str:
    return choice(name, "hash", EVENT_HASHES)


@lru_cache(maxsize=4096)
def _namespace_bytes(namespace: tuple) -> bytes:
    # JSON with explicit nulls: ("bc", "a") and ("c", "ab") encode differently
    return json.dumps(list(namespace), separators=(",", ":")).encode()


def chain_hash(parent: int | None, namespace: tuple, packed_tokens: bytes, algo: str = "sha256") -> int:
    """64-bit block hash of (parent hash, namespace, packed uint32 token ids)."""
    if algo == SIM_HASH:
        return sim64_chain(parent, _namespace_bytes(namespace), packed_tokens,
                           len(packed_tokens) // TOKEN_BYTES)[0]
    head = (b"\x00" * 8 if parent is None else parent.to_bytes(8, "little")) + _namespace_bytes(namespace)
    payload = len(head).to_bytes(4, "little") + head + packed_tokens
    if algo == "sha256":
        return int.from_bytes(hashlib.sha256(payload).digest()[:8], "little")
    return xxhash.xxh3_64_intdigest(payload)      # algo was checked where it was configured


def chain_hashes(parent: int | None, namespace: tuple, pages: list[bytes], algo: str = "sha256",
                 first: tuple | None = None, memo: bool = True) -> list[int]:
    """chain_hash down a run of pages, each chained on the one before (the first on `parent`):
    the same values, each looked up in the process's memo first unless `memo` is False (a
    caller that keeps each page's hash itself hashes new pages only). The first page mixes in
    `first` instead of `namespace` when given (a block chain salts its first block only)."""
    if algo == SIM_HASH:
        return chain_run(parent, namespace, b"".join(pages),
                         len(pages[0]) // TOKEN_BYTES if pages else 1, algo, first)
    out: list[int] = []
    if first is not None and pages:
        parent = _memo(parent, first, pages[0], algo)
        out.append(parent)
        pages = pages[1:]
    ns = _namespace_bytes(namespace)
    lead, zero, sha = (8 + len(ns)).to_bytes(4, "little"), b"\x00" * 8, algo == "sha256"
    if not memo:
        return _chain_plain(lead, zero if parent is None else parent.to_bytes(8, "little"),
                            ns, pages, sha, out)
    table = _MEMO
    for page in pages:
        k = (parent, namespace, page, algo)
        h = table.get(k)
        if h is None:
            payload = lead + (zero if parent is None else parent.to_bytes(8, "little")) + ns + page
            h = (int.from_bytes(hashlib.sha256(payload).digest()[:8], "little") if sha
                 else xxhash.xxh3_64_intdigest(payload))
            if len(table) >= _MEMO_MAX:
                table.clear()
            table[k] = h
        out.append(h)
        parent = h
    return out


def _chain_plain(lead: bytes, parent: bytes, ns: bytes, pages: list[bytes], sha: bool,
                 out: list[int]) -> list[int]:
    """chain_hashes' loop without the memo, appending to `out`; `lead`: the payload's length
    prefix, `parent`: the first page's parent hash as 8 little-endian bytes. A SHA-256 chain
    carries its parent as the digest's first 8 bytes (the hash) and converts to ints at the end."""
    if sha:
        sha256, digests = hashlib.sha256, []
        for page in pages:
            parent = sha256(lead + parent + ns + page).digest()[:8]
            digests.append(parent)
        out += [int.from_bytes(d, "little") for d in digests]
        return out
    for page in pages:
        h = xxhash.xxh3_64_intdigest(lead + parent + ns + page)
        out.append(h)
        parent = h.to_bytes(8, "little")
    return out


def chain_run(parent: int | None, namespace: tuple, buf: bytes, page_size: int,
              algo: str = "sha256", first: tuple | None = None) -> list[int]:
    """chain_hashes of the whole pages of `buf` (packed token ids, `page_size` to a page)."""
    if algo == SIM_HASH:
        return sim64_chain(parent, _namespace_bytes(namespace), buf, page_size,
                           None if first is None else _namespace_bytes(first))
    pb = TOKEN_BYTES * page_size
    return chain_hashes(parent, namespace, [buf[i:i + pb] for i in range(0, len(buf) - pb + 1, pb)],
                        algo, first)


def key_chain(key: RadixKey, inner: tuple, page_size: int, algo: str) -> list[int]:
    """The chained hash of every whole page of `key`, in one call: its namespace salts the
    first page, `inner` the rest."""
    return chain_run(None, inner, key.buf, page_size, algo, first=key.namespace)


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


class EventRun(NamedTuple):
    """The KV events of a run of pages, kept as one record until someone asks for the pages: a
    stored run's pages each chain on the one before (the first on `parent`), an evicted run's
    pages are removed in order; "cleared" has no pages. What a radix cache records (one per
    node stored or evicted); `pages()` gives the same KVEvents one by one."""
    kind: Literal["stored", "removed", "cleared"]
    hashes: list[int]
    parent: int | None = None            # "stored": the first page's parent
    tokens: bytes = b""                  # "stored": the pages' token ids, packed (key.py)
    namespace: tuple = (None, None)

    def num_tokens(self) -> int:
        """Tokens the run carries ("stored": its pages' token ids; otherwise 0)."""
        return len(self.tokens) // TOKEN_BYTES

    def whole_pages(self, page_size: int) -> bool:
        """Its tokens are exactly one page of `page_size` per hash."""
        return len(self.tokens) == TOKEN_BYTES * page_size * len(self.hashes)

    def pages(self) -> list[KVEvent]:
        if self.kind == "removed":
            return removed_events(self.hashes, self.namespace)
        if self.kind == "cleared":
            return [KVEvent("cleared")]
        hs, ns = self.hashes, self.namespace
        if not hs:
            return []
        ps = len(self.tokens) // TOKEN_BYTES // len(hs)
        tokens = token_struct(len(self.tokens) // TOKEN_BYTES).unpack(self.tokens)
        return [new_event(KVEvent, ("stored", h, p, tokens[i * ps:(i + 1) * ps], ns))
                for i, (h, p) in enumerate(zip(hs, [self.parent, *hs]))]


def run_pages(records: Iterable[KVEvent | EventRun]) -> list[KVEvent]:
    """KVEvents, with each EventRun among them expanded into its pages."""
    out: list[KVEvent] = []
    for r in records:
        if isinstance(r, EventRun):
            out += r.pages()
        else:
            out.append(r)
    return out
