"""Frozen configuration, validated at construction and never mutated.

Derived values are properties; a bad value raises ValueError naming the field and the value.
A field's metadata names its command-line flag (as SGLang or vLLM name it) and help text;
radixkv.commands.flags builds the flags of every subcommand from it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from radixkv.validate import choice, finite_at_least, fraction, int_at_least, positive_int


def _ints(obj, *names: str, lo: int = 1) -> None:
    for n in names:
        int_at_least(getattr(obj, n), f"{type(obj).__name__}.{n}", lo)


def _flag(flag: str, help: str, *aliases: str, **extra) -> dict:
    """Field metadata for radixkv.commands.flags: `aliases` are old spellings (hidden);
    `choices` is "module:NAME" of the registry the value is one of, read for --help only;
    `caches` are the cache kinds a cache option applies to (default: all)."""
    return {"flag": flag, "help": help, "aliases": aliases, **extra}


def _choice(obj, name: str, kind: str, valid) -> None:
    try:
        choice(getattr(obj, name), kind, valid)
    except ValueError as e:
        raise ValueError(f"{type(obj).__name__}.{name}: {e}") from None


@dataclass(frozen=True)
class CacheConfig:
    kind: str = field(default="radix", metadata=_flag(          # radix | blockhash | none
        "--cache", "prefix cache", choices="radixkv.cache.factory:CACHES"))
    page_size: int = field(default=1, metadata=_flag(           # for blockhash: the block size
        "--page-size", "tokens per KV page of the radix and none caches",
        caches=("radix", "none")))
    eviction: str = field(default="lru", metadata=_flag(        # "belady": simulation only
        "--radix-eviction-policy", "radix eviction order (belady: the future-aware oracle, "
        "simulation only)", "--eviction", choices="radixkv.cache.policies:EVICTION_POLICIES",
        caches=("radix",)))
    slru_threshold: int = field(default=2, metadata=_flag(
        "--slru-threshold", "slru: hits that promote an entry to the protected segment",
        caches=("radix",)))
    hash_algo: str = field(default="sha256", metadata=_flag(
        "--prefix-caching-hash-algo", "block hash of the blockhash cache and of KV events",
        "--hash", choices="radixkv.cache.events:HASH_ALGOS", caches=("blockhash",)))
    evict_granularity: str = field(default="page", metadata=_flag(   # blockhash: blocks are pages
        "--evict-granularity", "what one radix eviction removes (node: whole least-recent "
        "leaves, which may free more than asked; page: exactly the pages asked for, trimmed "
        "from the end of the least-recent leaf)", choices="radixkv.cache.radix:EVICT_GRANULARITIES",
        caches=("radix",)))
    retention_horizon: float = field(default=30.0, metadata=_flag(
        "--retention-horizon", "retention eviction: seconds of recency one priority level buys "
        "a prefix", caches=("radix",)))
    max_pinned_tokens: int = field(default=0, metadata=_flag(
        "--max-pinned-tokens", "tokens pinned prefixes may hold; 0: a quarter of the KV pool",
        caches=("radix",)))
    host_kv_tokens: int = field(default=0, metadata=_flag(
        "--host-kv-tokens", "host-memory tier below the radix cache, in tokens; 0: none",
        caches=("radix",)))
    host_write_policy: str = field(default="write_back", metadata=_flag(
        "--hicache-write-policy", "when device KV is copied to the host tier",
        choices="radixkv.cache.host_tier:WRITE_POLICIES", caches=("radix",)))
    enable_events: bool = False

    def __post_init__(self):
        from radixkv.cache.events import HASH_ALGOS
        from radixkv.cache.factory import CACHES
        from radixkv.cache.host_tier import WRITE_POLICIES
        from radixkv.cache.policies import EVICTION_POLICIES
        from radixkv.cache.radix import EVICT_GRANULARITIES
        _choice(self, "kind", "cache", CACHES)
        positive_int(self.page_size, "CacheConfig.page_size")     # the cache's own wording
        _ints(self, "slru_threshold")
        _choice(self, "eviction", "eviction policy", EVICTION_POLICIES)
        _choice(self, "hash_algo", "hash", HASH_ALGOS)
        _choice(self, "evict_granularity", "evict granularity", EVICT_GRANULARITIES)
        _choice(self, "host_write_policy", "host write policy", WRITE_POLICIES)
        _ints(self, "max_pinned_tokens", "host_kv_tokens", lo=0)
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


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = field(default="fcfs", metadata=_flag(
        "--schedule-policy", "queue order", "--policy",
        choices="radixkv.sched.policy:QUEUE_ORDERS"))
    max_prefill_tokens: int = field(default=16384, metadata=_flag(   # per prefill batch
        "--max-prefill-tokens", "new tokens one prefill batch may take"))
    chunked_prefill_size: int = field(default=8192, metadata=_flag(  # 0 disables chunking
        "--chunked-prefill-size", "longest prefill chunk in tokens; 0 or -1: no chunking",
        "--chunked-prefill", off=-1))
    max_running_requests: int = field(default=256, metadata=_flag(
        "--max-running-requests", "requests running at once", "--max-running"))
    dedup: bool = field(default=True, metadata=_flag(                # in-batch prefix dedup
        "--disable-inbatch-dedup", "admit requests sharing a prefix not yet cached in the same "
        "batch, instead of holding the later ones back until the first is prefilled",
        "--no-dedup", negate=True))
    dedup_check_threshold: int = field(default=32, metadata=_flag(
        "--inbatch-dedup-check-threshold",
        "in-batch dedup checks only requests whose cached prefix is at most this many tokens"))
    dedup_hold_threshold: int = field(default=32, metadata=_flag(
        "--inbatch-dedup-hold-threshold",
        "in-batch dedup holds back a request sharing at least this many new tokens"))
    lpm_fallback_threshold: int = field(default=0, metadata=_flag(   # SGLang uses 128
        "--lpm-fallback-threshold", "lpm orders as fcfs while more requests than this wait; "
        "0: never"))
    lpm_max_wait: float = field(default=4.0, metadata=_flag(         # seconds; by measurement
        "--lpm-max-wait", "lpm and dfs-weight admit requests waiting longer than this many "
        "seconds first, fcfs among them; 0: never"))
    queue_aware_eviction: bool = field(default=True, metadata=_flag(   # on: by measurement
        "--disable-queue-aware-eviction", "evict what a waiting request will hit like anything "
        "else, instead of only when nothing else is evictable", negate=True))
    retract_policy: str = field(default="most-remaining", metadata=_flag(
        "--retract-policy", "which running request is retracted when decode runs out of KV",
        choices="radixkv.sched.policy:RETRACT_ORDERS"))
    retract_insert: bool = field(default=False, metadata=_flag(
        "--retract-insert", "insert a retracted request's computed KV into the cache"))
    init_new_token_ratio: float = field(default=0.7, metadata=_flag(
        "--init-new-token-ratio", "share of its remaining output a running request reserves"))
    min_new_token_ratio: float = field(default=0.1, metadata=_flag(
        "--min-new-token-ratio", "floor of that share"))
    new_token_ratio_decay: float = field(default=0.001, metadata=_flag(   # per decode step
        "--new-token-ratio-decay", "decrease of that share per decode step"))
    mixed_decode: bool = field(default=False, metadata=_flag(
        "--enable-mixed-chunk", "run decodes in the same step as a prefill"))
    seed: int = field(default=0, metadata=_flag(                     # for the random policy
        "--seed", "seed of the workload generator, the random queue order, and generate's "
        "weights and sampling"))

    def __post_init__(self):
        from radixkv.sched.policy import QUEUE_ORDERS, RETRACT_ORDERS
        _choice(self, "policy", "queue policy", QUEUE_ORDERS)
        _choice(self, "retract_policy", "retract policy", RETRACT_ORDERS)
        _ints(self, "max_prefill_tokens", "max_running_requests")
        _ints(self, "chunked_prefill_size", "dedup_check_threshold", "dedup_hold_threshold",
              "lpm_fallback_threshold", "seed", lo=0)
        finite_at_least(self.lpm_max_wait, "SchedulerConfig.lpm_max_wait", 0)
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
    kv_capacity: int = field(default=200_000, metadata=_flag(        # KV slots (tokens)
        "--max-total-tokens", "KV pool: tokens, or a byte size such as 12GiB at the model's "
        "KV bytes per token", "--kv-capacity", "--capacity", metavar="TOKENS|SIZE"))
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedulerConfig = field(default_factory=SchedulerConfig)
    check_invariants: bool = field(default=False, metadata=_flag(    # after every step
        "--check-invariants", "assert the cache and pool invariants after every step, slowly",
        "--check"))
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
