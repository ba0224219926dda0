"""Cache variants by name: `make_cache("radix" | "blockhash" | "none", **options)`."""
from __future__ import annotations

from radixkv.cache.base import PrefixCache
from radixkv.cache.blockhash import BlockHashCache
from radixkv.cache.nocache import NoCache
from radixkv.cache.radix import RadixCache
from radixkv.registry import Registry

CACHES: Registry[type[PrefixCache]] = Registry("cache")
CACHES.add("radix", RadixCache)
CACHES.add("blockhash", BlockHashCache)
CACHES.add("none", NoCache)


def make_cache(name: str, **options) -> PrefixCache:
    return CACHES.get(name)(**options)
