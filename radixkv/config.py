"""Frozen configuration, validated at construction and never mutated.

Derived values are properties; a bad value raises ValueError naming the field and the value.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from radixkv.validate import choice, fraction, int_at_least, positive_int


def _ints(obj, *names: str, lo: int = 1) -> None:
    for n in names:
        int_at_least(getattr(obj, n), f"{type(obj).__name__}.{n}", lo)


def _choice(obj, name: str, kind: str, valid) -> None:
    try:
        choice(getattr(obj, name), kind, valid)
    except ValueError as e:
        raise ValueError(f"{type(obj).__name__}.{name}: {e}") from None


@dataclass(frozen=True)
class CacheConfig:
    kind: str = "radix"                   # radix | blockhash | none
    page_size: int = 1                    # radix page; for blockhash this is the block size
    eviction: str = "lru"                 # an eviction order name, or "belady" (simulation only)
    slru_threshold: int = 2
    hash_algo: str = "sha256"
    enable_events: bool = False

    def __post_init__(self):
        from radixkv.cache.events import HASH_ALGOS
        from radixkv.cache.factory import CACHES
        from radixkv.cache.policies import EVICTION_POLICIES
        _choice(self, "kind", "cache", CACHES)
        positive_int(self.page_size, "CacheConfig.page_size")     # the cache's own wording
        _ints(self, "slru_threshold")
        _choice(self, "eviction", "eviction policy", EVICTION_POLICIES)
        _choice(self, "hash_algo", "hash", HASH_ALGOS)
        if self.kind == "blockhash" and self.eviction != "lru":
            raise ValueError(f"blockhash caches evict in LRU order only, got eviction={self.eviction!r}")

    def build(self, **extra):
        """A fresh cache of this configuration (extra: clock, oracle, ...)."""
        from radixkv.cache.factory import make_cache
        if self.kind == "radix":
            params = {"threshold": self.slru_threshold} if self.eviction == "slru" else {}
            return make_cache("radix", page_size=self.page_size, eviction_policy=self.eviction,
                              enable_events=self.enable_events, hash_algo=self.hash_algo,
                              **params, **extra)
        if self.kind == "blockhash":
            return make_cache("blockhash", block_size=self.page_size, hash_algo=self.hash_algo,
                              enable_events=self.enable_events)
        return make_cache("none", page_size=self.page_size)

    @property
    def label(self) -> str:
        """The label the built cache reports: "radix p1 lru", "blockhash b16 sha256", "none"."""
        from radixkv.cache.factory import CACHES
        return CACHES.get(self.kind).describe(self.page_size, self.eviction, self.hash_algo)


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "fcfs"
    max_prefill_tokens: int = 16384       # new tokens per prefill batch
    chunked_prefill_size: int = 8192      # 0 disables chunking
    max_running_requests: int = 256
    dedup: bool = True                    # in-batch prefix dedup
    dedup_check_threshold: int = 32       # only requests matching <= this many tokens are checked
    dedup_hold_threshold: int = 32        # held back when sharing >= this many within the batch
    lpm_fallback_threshold: int = 0       # 0: never fall back to fcfs (SGLang uses 128)
    retract_policy: str = "most-remaining"
    retract_insert: bool = False          # insert a retracted request's KV into the tree
    init_new_token_ratio: float = 0.7     # share of remaining decode reserved per request
    min_new_token_ratio: float = 0.1
    new_token_ratio_decay: float = 0.001  # per decode step
    mixed_decode: bool = False            # run decodes in the same step as a prefill
    seed: int = 0                         # for the random policy

    def __post_init__(self):
        from radixkv.sched.policy import QUEUE_ORDERS, RETRACT_ORDERS
        _choice(self, "policy", "queue policy", QUEUE_ORDERS)
        _choice(self, "retract_policy", "retract policy", RETRACT_ORDERS)
        _ints(self, "max_prefill_tokens", "max_running_requests")
        _ints(self, "chunked_prefill_size", "dedup_check_threshold", "dedup_hold_threshold",
              "lpm_fallback_threshold", "seed", lo=0)
        for n in ("init_new_token_ratio", "min_new_token_ratio", "new_token_ratio_decay"):
            fraction(getattr(self, n), f"SchedulerConfig.{n}")
        if self.min_new_token_ratio > self.init_new_token_ratio:
            raise ValueError("min_new_token_ratio must not exceed init_new_token_ratio")

    @property
    def prefill_budget(self) -> int:
        """New tokens one prefill step may take."""
        if self.chunked_prefill_size:
            return min(self.max_prefill_tokens, self.chunked_prefill_size)
        return self.max_prefill_tokens


@dataclass(frozen=True)
class EngineConfig:
    kv_capacity: int = 200_000            # KV slots (tokens) in the pool
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedulerConfig = field(default_factory=SchedulerConfig)
    check_invariants: bool = False        # assert cache + pool invariants after every step
    name: str = ""

    def __post_init__(self):
        _ints(self, "kv_capacity")
        ps, chunk = self.cache.page_size, self.sched.chunked_prefill_size
        if chunk and self.sched.prefill_budget < ps:
            raise ValueError(f"chunked prefill budget {self.sched.prefill_budget} is smaller than "
                             f"the page size {ps}: no chunk could ever be scheduled")
        if self.kv_capacity % self.cache.page_size:
            raise ValueError(f"kv_capacity {self.kv_capacity} is not a multiple of page size "
                             f"{self.cache.page_size}")

    @property
    def label(self) -> str:
        return self.name or f"{self.cache.label}/{self.sched.policy}"

    def with_(self, **kw) -> "EngineConfig":
        return replace(self, **kw)
