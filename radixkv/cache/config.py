"""The cache's configuration: `CacheConfig`, frozen and validated at construction against the
cache layer's own registries; `build()` and `label` are the one way to make and name a cache.
A field's metadata names its command-line flag (radixkv.commands.flags reads it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixkv.argcheck import cli_flag, field_choice, fields_at_least, finite_at_least, positive_int


@dataclass(frozen=True)
class CacheConfig:
    kind: str = field(default="radix", metadata=cli_flag(          # radix | blockhash | none
        "--cache", "prefix cache", choices="radixkv.cache.factory:CACHES"))
    page_size: int = field(default=1, metadata=cli_flag(           # for blockhash: the block size
        "--page-size", "tokens per KV page of the radix and none caches",
        caches=("radix", "none")))
    eviction: str = field(default="lru", metadata=cli_flag(        # "belady": simulation only
        "--radix-eviction-policy", "radix eviction order (belady: the future-aware oracle, "
        "simulation only)", "--eviction", choices="radixkv.cache.policies:EVICTION_POLICIES",
        caches=("radix",)))
    slru_threshold: int = field(default=2, metadata=cli_flag(
        "--slru-threshold", "slru: hits that promote an entry to the protected segment",
        caches=("radix",)))
    hash_algo: str = field(default="sha256", metadata=cli_flag(
        "--prefix-caching-hash-algo", "block hash of the blockhash cache and of KV events",
        "--hash", choices="radixkv.cache.events:HASH_ALGOS", caches=("blockhash",)))
    evict_granularity: str = field(default="page", metadata=cli_flag(   # blockhash: blocks are pages
        "--evict-granularity", "what one radix eviction removes (node: whole least-recent "
        "leaves, which may free more than asked; page: exactly the pages asked for, trimmed "
        "from the end of the least-recent leaf)", choices="radixkv.cache.radix:EVICT_GRANULARITIES",
        caches=("radix",)))
    retention_horizon: float = field(default=30.0, metadata=cli_flag(
        "--retention-horizon", "retention eviction: seconds of recency one priority level buys "
        "a prefix", caches=("radix",)))
    max_pinned_tokens: int = field(default=0, metadata=cli_flag(
        "--max-pinned-tokens", "tokens pinned prefixes may hold; 0: a quarter of the KV pool",
        caches=("radix",)))
    host_kv_tokens: int = field(default=0, metadata=cli_flag(
        "--host-kv-tokens", "host-memory tier below the radix cache, in tokens; 0: none",
        caches=("radix",)))
    host_write_policy: str = field(default="write_back", metadata=cli_flag(
        "--hicache-write-policy", "when device KV is copied to the host tier",
        choices="radixkv.cache.host_tier:WRITE_POLICIES", caches=("radix",)))
    enable_events: bool = False

    def __post_init__(self):
        from radixkv.cache.events import EVENT_HASHES
        from radixkv.cache.factory import CACHES
        from radixkv.cache.host_tier import WRITE_POLICIES
        from radixkv.cache.policies import EVICTION_POLICIES
        from radixkv.cache.radix import EVICT_GRANULARITIES
        field_choice(self, "kind", "cache", CACHES)
        positive_int(self.page_size, "CacheConfig.page_size")     # the cache's own wording
        fields_at_least(self, "slru_threshold")
        field_choice(self, "eviction", "eviction policy", EVICTION_POLICIES)
        field_choice(self, "hash_algo", "hash", EVENT_HASHES)
        field_choice(self, "evict_granularity", "evict granularity", EVICT_GRANULARITIES)
        field_choice(self, "host_write_policy", "host write policy", WRITE_POLICIES)
        fields_at_least(self, "max_pinned_tokens", "host_kv_tokens", lo=0)
        finite_at_least(self.retention_horizon, "CacheConfig.retention_horizon", 0)
        if self.host_kv_tokens % self.page_size:
            raise ValueError(f"CacheConfig.host_kv_tokens: {self.host_kv_tokens} is not a "
                             f"multiple of page size {self.page_size}")
        if self.kind == "blockhash" and self.eviction != "lru":
            raise ValueError(f"blockhash caches evict in LRU order only, got eviction={self.eviction!r}")

    def build(self, **extra):
        """A fresh cache of this configuration (extra: clock, oracle, ...)."""
        from radixkv.cache.factory import make_cache
        if self.kind == "radix":
            from radixkv.cache.host_tier import HostTier
            params = {"threshold": self.slru_threshold} if self.eviction == "slru" else {}
            if self.eviction == "retention":
                params = {"horizon": self.retention_horizon}
            host = HostTier(self.host_kv_tokens, self.page_size, self.host_write_policy) \
                if self.host_kv_tokens else None
            return make_cache("radix", page_size=self.page_size, eviction_policy=self.eviction,
                              enable_events=self.enable_events, hash_algo=self.hash_algo,
                              evict_granularity=self.evict_granularity,
                              max_pinned_tokens=self.max_pinned_tokens or None, host_tier=host,
                              **params, **extra)
        if self.kind == "blockhash":
            return make_cache("blockhash", block_size=self.page_size, hash_algo=self.hash_algo,
                              enable_events=self.enable_events)
        return make_cache("none", page_size=self.page_size)

    @property
    def label(self) -> str:
        """The label the built cache reports: "radix p1 lru", "blockhash b16 sha256", "none"."""
        from radixkv.cache.factory import CACHES
        return CACHES.get(self.kind).describe(self.page_size, self.eviction, self.hash_algo,
                                              self.evict_granularity)
