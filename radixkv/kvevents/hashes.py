"""A prompt's page hashes as a router computes them: the chained hashes a cache emits in its KV
events when it stores the prompt's whole pages (`page_hashes`), or the same computed only as
far as they are read (`PageHashes`).

A router matching a prompt against what each replica holds stops at the first page no replica
holds; the pages after it are new everywhere, and hashing them (a SHA-256 a page, ~0.7 µs at
one token a page) is most of a fresh prompt's routing cost. `PageHashes` hashes span by span
(_SPAN pages) as it is iterated or indexed: a fresh 4,000-token prompt at one token a page costs
one span, not 4,000 pages, until something reads further. Whole aligned spans already hashed
are remembered in both forms: a long shared prefix costs a lookup a span.

The hashes are radixkv's (cache/events.py: what radixkv's caches emit) or, for a fleet of vLLM
workers, vLLM's own (kvevents/vllm_hash.py): `ROUTE_HASHES` names both.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice

from radixkv.cache.events import EVENT_HASHES, chain_hashes, key_chain
from radixkv.cache.key import RadixKey
from radixkv.cache.sim_hash import SIM_HASH
from radixkv.argcheck import choice, positive_int
from radixkv.kvevents import vllm_hash

# the hashes a router can look prompts up by: radixkv's caches' and vLLM's
ROUTE_HASHES = EVENT_HASHES + tuple(vllm_hash.VLLM_SCHEMES)


def check_route_hash(name: str) -> str:
    return choice(name, "hash", ROUTE_HASHES)

# whole aligned spans of _SPAN pages already hashed (each page is also in the cache layer's
# memo, radixkv.cache.events): a long shared prefix costs a lookup per span, not per page
_SPAN = 64
_SPAN_MEMO: dict[tuple, tuple[int, ...]] = {}
_SPAN_MEMO_MAX = 1 << 14


class PageHashes(Sequence[int]):
    """The chained hashes of the whole pages of `tokens` (ids, or a RadixKey already packed)
    under `namespace` (extra_key, cache_salt), computed span by span as they are read; the
    arguments as `page_hashes` takes them. `len` is the number of whole pages (nothing is
    hashed for it); `done` how many are hashed so far; `extend_to(k)` hashes the first k."""
    __slots__ = ("key", "_inner", "_ps", "_algo", "_memo", "_n", "_out", "_digest")

    def __init__(self, tokens, namespace: tuple, page_size: int, algo: str = "sha256", *,
                 salt_first_only: bool = False, memo: bool = True):
        if not isinstance(namespace, tuple) or len(namespace) != 2:
            raise ValueError(f"namespace must be a tuple (extra_key, cache_salt), got "
                             f"{namespace!r}")
        self.key = tokens if isinstance(tokens, RadixKey) and tokens.namespace == namespace \
            else RadixKey(tokens, extra_key=namespace[0], cache_salt=namespace[1])
        self._ps, self._algo = positive_int(page_size, "page_size"), check_route_hash(algo)
        if algo in vllm_hash.VLLM_SCHEMES and self.key.namespace[0] is not None:
            raise ValueError(f"{algo} hashes take a cache_salt, not the extra key "
                             f"{self.key.namespace[0]!r} (vLLM keys a LoRA by its name and path)")
        self._digest: bytes | None = None       # vLLM's schemes: the last page's whole digest
        self._inner = (self.key.namespace[0], None) if salt_first_only else self.key.namespace
        self._memo = memo
        self._n = len(self.key) // self._ps
        self._out: list[int] = []

    def __len__(self) -> int:
        return self._n

    @property
    def done(self) -> int:
        """Pages hashed so far (a prefix of the prompt's)."""
        return len(self._out)

    def extend_to(self, k: int) -> list[int]:
        """Hash at least the first min(k, len) pages; returns the hashes computed so far (the
        list itself: read it, never change it)."""
        while len(self._out) < min(k, self._n):
            self._step()
        return self._out

    def all(self) -> list[int]:
        return self.extend_to(self._n)

    def _step(self) -> None:
        """Hash the next span (or, at the end, the pages left)."""
        key, ps, algo, out = self.key, self._ps, self._algo, self._out
        if algo == SIM_HASH:                  # a whole prompt in one vectorised run
            out[:] = key_chain(key, self._inner, ps, algo)
            return
        i = len(out)
        if algo in vllm_hash.VLLM_SCHEMES:    # chained on whole digests, sent as ints
            stop = min(i + _SPAN, self._n)
            ids = key.numpy()[i * ps:stop * ps].tolist()
            digests = vllm_hash.chain(algo, self._digest, [ids[j:j + ps] for j in
                                                           range(0, len(ids), ps)],
                                      vllm_hash.first_extra(key.namespace[1]) if i == 0 else None)
            self._digest = digests[-1]
            out.extend(map(vllm_hash.to_int, digests))
            return
        parent = out[-1] if i else None
        if i + _SPAN > self._n:
            out.extend(_chain(parent, key, self._inner, i, self._n, ps, algo, self._memo))
            return
        k = (parent, key.namespace, self._inner, i == 0, key.page(i // _SPAN, ps * _SPAN), ps,
             algo)
        span = _SPAN_MEMO.get(k)
        if span is None:
            span = _chain(parent, key, self._inner, i, i + _SPAN, ps, algo, self._memo)
            if len(_SPAN_MEMO) >= _SPAN_MEMO_MAX:
                _SPAN_MEMO.clear()
            _SPAN_MEMO[k] = span
        out.extend(span)

    def _spans(self) -> Iterator[Iterable[int]]:
        yield islice(self._out, len(self._out))    # what is hashed now, without copying it
        while len(self._out) < self._n:
            start = len(self._out)
            self._step()
            yield self._out[start:]

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._spans())

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            return self.extend_to(stop if step > 0 else start + 1)[i]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"page {i} of a prompt of {self._n} pages")
        return self.extend_to(i + 1)[i]


def page_hashes(tokens, namespace: tuple, page_size: int, algo: str = "sha256", *,
                salt_first_only: bool = False, memo: bool = True) -> list[int]:
    """The chained hashes of the whole pages of `tokens` (ids, or a RadixKey already packed)
    under `namespace` (extra_key, cache_salt): what a cache emits when it stores them.
    RadixCache mixes the whole namespace into every page; BlockHashCache, as vLLM, mixes
    cache_salt into the first page only (salt_first_only=True). Without a salt both agree.
    `memo` False skips the per-page memo (cache/events.py), which only pays where the caches
    that fill it run in this process: a page missing from it costs twice as much to hash
    through it."""
    return PageHashes(tokens, namespace, page_size, algo, salt_first_only=salt_first_only,
                      memo=memo).all()


def _chain(parent: int | None, key: RadixKey, inner: tuple, start: int, stop: int,
           page_size: int, algo: str, memo: bool = True) -> tuple[int, ...]:
    """The hashes of pages [start, stop) of `key`, chained from `parent` (the first page of
    the key mixes in its whole namespace, the others `inner`)."""
    return tuple(chain_hashes(parent, inner, key.pages(start, stop, page_size), algo,
                              first=key.namespace if start == 0 else None, memo=memo))
