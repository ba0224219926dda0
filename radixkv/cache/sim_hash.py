"""`sim64`: a chained 64-bit page hash computed for a whole run of pages at once, for KV events
that never leave the process (the cluster simulator's caches and routers). sha256 and xxhash
stay the hashes published to the world; this one is neither cryptographic nor any peer's.

For pages p_0 .. p_{n-1} of `page_size` uint32 token ids t_{i,k}, chained on `parent`:

  d_i = sum_k (t_{i,k} + A_k) * B_k + Z_i       (a multilinear digest of the page, mod 2**64)
  S_i = S_{i-1} * M + d_i,  S_{-1} = parent      (0 for none);  hash_i = S_i

A_k and B_k (odd) come from a splitmix64 stream, M is odd, Z_i is a 64-bit digest of the
namespace (of `first` for page 0, when given). M being odd is invertible mod 2**64, so the chain
unrolls into one prefix sum: S_i = M**i * (M * S_{-1} + sum_{j<=i} M**-j * d_j). A page's hash
depends on its whole prefix and namespace, as a chained hash must, wherever a run starts.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

SIM_HASH = "sim64"
_MASK = (1 << 64) - 1
_M = 0x9E3779B97F4A7C15                      # odd: invertible mod 2**64
_M_INV = pow(_M, -1, 1 << 64)


def _splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & _MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return state, z ^ (z >> 31)


class _Tables:
    """The constants, grown on demand: A, B per token position; M**i and M**-i per page."""

    def __init__(self) -> None:
        self.a = self.b = np.zeros(0, np.uint64)
        self.ab = 0                               # sum_k A_k * B_k for the current page size
        self.ab_size = -1
        self.pw = self.ipw = np.zeros(0, np.uint64)

    def tokens(self, page_size: int) -> tuple[np.ndarray, int]:
        if len(self.a) < page_size:
            a, b, state = [], [], 0x5EED
            for _ in range(page_size):
                state, x = _splitmix64(state)
                state, y = _splitmix64(state)
                a.append(x)
                b.append(y | 1)
            self.a, self.b = np.array(a, np.uint64), np.array(b, np.uint64)
        if self.ab_size != page_size:
            self.ab = sum(int(x) * int(y) for x, y in zip(self.a[:page_size], self.b[:page_size]))
            self.ab, self.ab_size = self.ab & _MASK, page_size
        return self.b[:page_size], self.ab

    def powers(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.pw) < n:
            size = max(n, 2 * len(self.pw), 1024)
            pw, ipw, p, q = [], [], 1, 1
            for _ in range(size):
                pw.append(p)
                ipw.append(q)
                p, q = p * _M & _MASK, q * _M_INV & _MASK
            self.pw, self.ipw = np.array(pw, np.uint64), np.array(ipw, np.uint64)
        return self.pw[:n], self.ipw[:n]


_TABLES = _Tables()


@lru_cache(maxsize=4096)
def _namespace_digest(ns_bytes: bytes) -> int:
    return int.from_bytes(hashlib.sha256(b"sim64" + ns_bytes).digest()[:8], "little")


def sim64_chain(parent: int | None, ns_bytes: bytes, buf: bytes, page_size: int,
                first_bytes: bytes | None = None) -> list[int]:
    """The hashes of the whole pages of `buf` (packed uint32 token ids), chained on `parent`;
    `ns_bytes` / `first_bytes` are the encoded namespaces (events._namespace_bytes)."""
    n = len(buf) // (4 * page_size)
    if n == 0:
        return []
    t = np.frombuffer(buf, np.uint32, n * page_size).reshape(n, page_size).astype(np.uint64)
    b, ab = _TABLES.tokens(page_size)
    d = t @ b + np.uint64((ab + _namespace_digest(ns_bytes)) & _MASK)
    if first_bytes is not None:
        d[0] = (int(d[0]) - _namespace_digest(ns_bytes) + _namespace_digest(first_bytes)) & _MASK
    pw, ipw = _TABLES.powers(n)
    head = np.uint64(_M * (parent or 0) & _MASK)
    return (pw * (np.cumsum(d * ipw, dtype=np.uint64) + head)).tolist()
