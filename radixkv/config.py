"""Frozen configuration, validated at construction and never mutated.

Derived values are properties; a bad value raises ValueError naming the field and the value.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace


def _pos_int(obj, *names: str, allow_zero: bool = False) -> None:
    for n in names:
        v = getattr(obj, n)
        lo = 0 if allow_zero else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{type(obj).__name__}.{n} must be an int >= {lo}, got {v!r}")


def _choice(obj, name: str, valid) -> None:
    v = getattr(obj, name)
    if v not in valid:
        raise ValueError(f"{type(obj).__name__}.{name}: unknown {v!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True)
class CacheConfig:
    kind: str = "radix"                   # radix | blockhash | none
    page_size: int = 1                    # radix page; for blockhash this is the block size
    eviction: str = "lru"                 # an eviction order name, or "belady" (simulation only)
    slru_threshold: int = 2
    hash_algo: str = "sha256"
    enable_events: bool = False

    def __post_init__(self):
        from radixkv.cache.factory import CACHES
        from radixkv.cache.policies import EVICTION_POLICIES
        _choice(self, "kind", CACHES.names())
        _pos_int(self, "page_size", "slru_threshold")
        _choice(self, "eviction", EVICTION_POLICIES.names())
        from radixkv.cache.events import HASH_ALGOS
        _choice(self, "hash_algo", HASH_ALGOS)
        if self.kind == "blockhash" and self.eviction not in ("lru",):
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
        if self.kind == "none":
            return "none"
        if self.kind == "blockhash":
            return f"blockhash{self.page_size}"
        return f"radix/p{self.page_size}/{self.eviction}"


QUEUE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "routing-key", "priority")
RETRACT_POLICIES = ("most-remaining", "least-progress", "newest")


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
        _choice(self, "policy", QUEUE_POLICIES)
        _choice(self, "retract_policy", RETRACT_POLICIES)
        _pos_int(self, "max_prefill_tokens", "max_running_requests")
        _pos_int(self, "chunked_prefill_size", "dedup_check_threshold", "dedup_hold_threshold",
                 "lpm_fallback_threshold", "seed", allow_zero=True)
        for n in ("init_new_token_ratio", "min_new_token_ratio", "new_token_ratio_decay"):
            v = getattr(self, n)
            if not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise ValueError(f"SchedulerConfig.{n} must be in [0, 1], got {v!r}")
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
        _pos_int(self, "kv_capacity")
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
