"""vLLM-style block hashing: the cache in cache.py and the collaborators it is built of — the
reference counts and the free queue (refs.py, free_queue.py), the handles and their views
(handles.py), the content trie's growth and pruning (trie.py) and the checks (check.py)."""
from radixkv.cache.blockhash.cache import BlockHashCache
from radixkv.cache.blockhash.handles import Block, Chain

__all__ = ["Block", "BlockHashCache", "Chain"]
