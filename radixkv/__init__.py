"""radixkv: a prefix-aware KV-cache manager and scheduler for LLM serving."""
__version__ = "0.1.0"
