"""Cache variants by name: `make_cache("radix" | "blockhash" | "none", **options)`."""
from __future__ import annotations

from radixkv.cache.base import PrefixCache
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.nocache import NoCache
from radixkv.cache.radix import RadixCache
from radixkv.registry import Registry

CACHES: Registry[type[PrefixCache]] = Registry("cache")
for _cls in (RadixCache, BlockHashCache, NoCache):
    CACHES.add(_cls.name, _cls)


def make_cache(name: str, **options) -> PrefixCache:
    return CACHES.get(name)(**options)
