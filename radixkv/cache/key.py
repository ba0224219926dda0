"""RadixKey: token ids plus a namespace, stored as packed uint32 bytes.

Packing the ids into one `bytes` object makes every hot operation C-level: slicing is a
memcpy, edge equality is a memcmp, a page of tokens is a hashable dict key, and the first
divergence of two runs is one XOR of two big integers (see `first_divergence`).
"""
from __future__ import annotations

import struct
from functools import lru_cache
from typing import Iterable, Iterator

import numpy as np

from radixkv.argcheck import is_int, optional_str

TOKEN_BYTES = 4                 # bytes per token id (uint32): `buf` holds len * TOKEN_BYTES
_ITEM = TOKEN_BYTES
_MAX_TOKEN = 2**32 - 1


def pack_tokens(tokens) -> bytes:
    """Validate and pack token ids into uint32 bytes; raises ValueError naming a bad id."""
    if isinstance(tokens, (bytes, bytearray, memoryview)):
        raise TypeError("token ids must be a sequence of ints, not bytes")
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"token ids must be a 1-D integer array, got dtype {tokens.dtype} "
                             f"and shape {tokens.shape}")
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) > _MAX_TOKEN):
            bad = tokens[(tokens < 0) | (tokens > _MAX_TOKEN)][0]
            raise ValueError(f"token id {int(bad)} is out of range [0, 2**32)")
        return tokens.astype("=u4", copy=False).tobytes()
    if iter(tokens) is tokens:      # a one-shot iterator: keep it for the slow path below
        tokens = list(tokens)
    try:                            # one compiled struct per length: twice array("I")'s speed
        return token_struct(len(tokens)).pack(*tokens)
    except (OverflowError, TypeError, struct.error):
        for t in tokens:            # slow path only to name the offending value
            if not is_int(t):
                raise ValueError(f"token id {t!r} is not an int") from None
            if not 0 <= t <= _MAX_TOKEN:
                raise ValueError(f"token id {t} is out of range [0, 2**32)") from None
        raise


@lru_cache(maxsize=1024)
def token_struct(n: int) -> struct.Struct:
    """n token ids as packed bytes and back (`unpack_from(buf, offset)` reads a page)."""
    return struct.Struct(f"={n}I")


def first_divergence(a: bytes, b: bytes) -> int:
    """Number of leading tokens two packed runs share, in a handful of C-level operations:
    one memcmp when they agree; otherwise an XOR of two big ints (short runs) or one
    vectorised compare (long runs, where big-int conversion would dominate)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n // _ITEM
    if n <= 256 * _ITEM:
        x = int.from_bytes(a[:n], "big") ^ int.from_bytes(b[:n], "big")
        return (n - (x.bit_length() + 7) // 8) // _ITEM     # first differing byte -> token
    m = n // 8                      # pairs of tokens: half the elements to compare
    ne = np.frombuffer(a, "=u8", m) != np.frombuffer(b, "=u8", m)
    i = int(ne.argmax()) if m else 0
    if m and not ne[i]:
        i = m                       # the pairs agree: the odd last token differs
    return 2 * i + (a[8 * i:8 * i + 4] == b[8 * i:8 * i + 4])


def namespace_of(extra_key: str | None, cache_salt: str | None) -> tuple[str | None, str | None]:
    return (optional_str(extra_key, "extra_key"), optional_str(cache_salt, "cache_salt"))


class RadixKey:
    """Token ids plus a namespace (extra_key such as a LoRA id, and cache_salt).

    Identical tokens in different namespaces never match. Supports len, iteration, indexing
    and slicing (a slice keeps the namespace).
    """
    __slots__ = ("buf", "namespace")

    def __init__(self, tokens: Iterable[int] = (), extra_key: str | None = None,
                 cache_salt: str | None = None):
        self.namespace = namespace_of(extra_key, cache_salt)
        self.buf = pack_tokens(tokens)

    @classmethod
    def _raw(cls, buf: bytes, namespace: tuple) -> "RadixKey":
        k = object.__new__(cls)
        k.buf, k.namespace = buf, namespace
        return k

    @property
    def extra_key(self) -> str | None:
        return self.namespace[0]

    @property
    def cache_salt(self) -> str | None:
        return self.namespace[1]

    @property
    def tokens(self) -> list[int]:
        return memoryview(self.buf).cast("I").tolist()

    def numpy(self) -> np.ndarray:
        return np.frombuffer(self.buf, dtype="=u4")

    def __len__(self) -> int:
        return len(self.buf) // _ITEM

    def __iter__(self) -> Iterator[int]:
        return iter(memoryview(self.buf).cast("I"))

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            if step != 1:
                raise ValueError("RadixKey slices must be contiguous (step 1)")
            return RadixKey._raw(self.buf[start * _ITEM:max(start, stop) * _ITEM], self.namespace)
        return memoryview(self.buf).cast("I")[idx]

    def __add__(self, other) -> "RadixKey":
        if isinstance(other, RadixKey):
            if other.namespace != self.namespace:
                raise ValueError(f"cannot join keys of namespaces {self.namespace} and {other.namespace}")
            return RadixKey._raw(self.buf + other.buf, self.namespace)
        return RadixKey._raw(self.buf + pack_tokens(other), self.namespace)

    def __eq__(self, other) -> bool:
        return (isinstance(other, RadixKey) and self.namespace == other.namespace
                and self.buf == other.buf)

    def __hash__(self) -> int:
        return hash((self.buf, self.namespace))

    @classmethod
    def concat(cls, keys: Iterable["RadixKey"]) -> "RadixKey":
        """One key from consecutive runs of one namespace (a path of tree edges)."""
        keys = list(keys)
        ns = keys[0].namespace if keys else (None, None)
        if any(k.namespace != ns for k in keys):
            raise ValueError(f"cannot join keys of namespaces {sorted({k.namespace for k in keys}, key=str)}")
        return cls._raw(b"".join(k.buf for k in keys), ns)

    # ---- token-level comparisons: the rest of the package never sees the byte layout ------------
    def page(self, i: int, page_size: int) -> bytes:
        """A hashable, namespace-free identity of page i (tokens [i * page_size, (i + 1) *
        page_size)): equal exactly when the token ids are equal (a tree's child-key, a
        block's hash input)."""
        return self.buf[i * page_size * _ITEM:(i + 1) * page_size * _ITEM]

    def pages(self, start: int, stop: int, page_size: int) -> list[bytes]:
        """[self.page(i, page_size) for i in range(start, stop)], in one slicing pass."""
        w, b = page_size * _ITEM, self.buf
        return [b[j:j + w] for j in range(start * w, stop * w, w)]

    def shared(self, other: "RadixKey", start: int = 0) -> int:
        """How many leading tokens of self[start:] agree with `other` (tokens only, namespace
        ignored): one memcmp when the whole of `other` agrees."""
        ob = other.buf
        a = self.buf[start * _ITEM:start * _ITEM + len(ob)]
        return len(ob) // _ITEM if a == ob else first_divergence(a, ob)

    def startswith(self, other: "RadixKey") -> bool:
        """Same namespace, and `other`'s tokens begin this key."""
        return self.namespace == other.namespace and self.buf.startswith(other.buf)

    def match(self, other: "RadixKey", page_size: int = 1) -> int:
        """Length of the common prefix, rounded down to whole pages."""
        if not isinstance(other, RadixKey):
            raise TypeError(f"RadixKey.match needs a RadixKey, got {type(other).__name__}")
        if other.namespace != self.namespace:
            raise ValueError(f"namespaces differ: {self.namespace} vs {other.namespace}")
        n = first_divergence(self.buf, other.buf)
        return n - n % page_size

    def __repr__(self) -> str:
        toks = self.tokens
        body = ", ".join(map(str, toks[:8])) + (f", ... (+{len(toks) - 8})" if len(toks) > 8 else "")
        ns = "" if self.namespace == (None, None) else f", namespace={self.namespace}"
        return f"RadixKey([{body}]{ns})"
