"""Frozen configuration, validated at construction and never mutated.

Derived values are properties; a bad value raises ValueError naming the field and the value.
A field's metadata names its command-line flag (as SGLang or vLLM name it) and help text;
radixkv.commands.flags builds the flags of every subcommand from it. Each layer owns its part
(cache/config.py: `CacheConfig`, sched/config.py: `SchedulerConfig`); `EngineConfig` composes
them with the KV pool, and this module is where every caller finds all three.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from radixkv.cache.config import CacheConfig
from radixkv.sched.config import SchedulerConfig
from radixkv.argcheck import cli_flag, fields_at_least

__all__ = ["CacheConfig", "SchedulerConfig", "EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    kv_capacity: int = field(default=200_000, metadata=cli_flag(        # KV slots (tokens)
        "--max-total-tokens", "KV pool: tokens, or a byte size such as 12GiB at the model's "
        "KV bytes per token", "--kv-capacity", "--capacity", metavar="TOKENS|SIZE"))
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedulerConfig = field(default_factory=SchedulerConfig)
    check_invariants: bool = field(default=False, metadata=cli_flag(    # after every step
        "--check-invariants", "assert the cache and pool invariants after every step, slowly",
        "--check"))
    name: str = ""

    def __post_init__(self):
        fields_at_least(self, "kv_capacity")
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
