"""The radix tree (RadixAttention): the cache in tree.py, its node in node.py and the
collaborators it is built of — the eviction order (evict.py), pins (pins.py) and the
structural check (check.py). `python -m radixkv.cache.radix` prints a small worked example."""
from radixkv.cache.radix.node import TreeNode
from radixkv.cache.radix.tree import EVICT_GRANULARITIES, RadixCache

__all__ = ["EVICT_GRANULARITIES", "RadixCache", "TreeNode"]
