"""The cache layer: prefix caches (radix tree, block hash, none), the slot pool, eviction orders,
and the CacheManager that runs a request's lifecycle over a cache and its pool.

Built without torch or a GPU; imports nothing from the layers above it. Cache classes are
imported lazily so `python -m radixkv.cache.radix` runs its demo without a double import.
"""
from importlib import import_module

from radixkv.cache.base import CacheReq, InsertResult, MatchResult, PrefixCache
from radixkv.cache.key import RadixKey
from radixkv.cache.policies import EVICTION_POLICIES
from radixkv.cache.pool import OutOfSlotsError, SlotPool

_LAZY = {"RadixCache": "radix", "TreeNode": "radix", "NoCache": "nocache",
         "BlockHashCache": "blockhash", "CACHES": "factory", "make_cache": "factory",
         "CacheManager": "manager"}

__all__ = ["CacheReq", "InsertResult", "MatchResult", "PrefixCache", "RadixKey", "SlotPool",
           "OutOfSlotsError", "EVICTION_POLICIES", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f"radixkv.cache.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'radixkv.cache' has no attribute {name!r}")
