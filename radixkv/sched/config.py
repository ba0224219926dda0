"""The scheduler's configuration: `SchedulerConfig`, frozen and validated at construction against
the queue and retraction orders registered in sched/policy.py. A field's metadata names its
command-line flag (radixkv.commands.flags reads it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from radixkv.argcheck import cli_flag, field_choice, fields_at_least, finite_at_least, fraction


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = field(default="fcfs", metadata=cli_flag(
        "--schedule-policy", "queue order", "--policy",
        choices="radixkv.sched.policy:QUEUE_ORDERS"))
    max_prefill_tokens: int = field(default=16384, metadata=cli_flag(   # per prefill batch
        "--max-prefill-tokens", "new tokens one prefill batch may take"))
    chunked_prefill_size: int = field(default=8192, metadata=cli_flag(  # 0 disables chunking
        "--chunked-prefill-size", "longest prefill chunk in tokens; 0 or -1: no chunking",
        "--chunked-prefill", off=-1))
    max_running_requests: int = field(default=256, metadata=cli_flag(
        "--max-running-requests", "requests running at once", "--max-running"))
    dedup: bool = field(default=True, metadata=cli_flag(                # in-batch prefix dedup
        "--disable-inbatch-dedup", "admit requests sharing a prefix not yet cached in the same "
        "batch, instead of holding the later ones back until the first is prefilled",
        "--no-dedup", negate=True))
    dedup_check_threshold: int = field(default=32, metadata=cli_flag(
        "--inbatch-dedup-check-threshold",
        "in-batch dedup checks only requests whose cached prefix is at most this many tokens"))
    dedup_hold_threshold: int = field(default=32, metadata=cli_flag(
        "--inbatch-dedup-hold-threshold",
        "in-batch dedup holds back a request sharing at least this many new tokens"))
    lpm_fallback_threshold: int = field(default=0, metadata=cli_flag(   # SGLang uses 128
        "--lpm-fallback-threshold", "lpm orders as fcfs while more requests than this wait; "
        "0: never"))
    lpm_max_wait: float = field(default=4.0, metadata=cli_flag(         # seconds; by measurement
        "--lpm-max-wait", "lpm and dfs-weight admit requests waiting longer than this many "
        "seconds first, fcfs among them; 0: never"))
    queue_aware_eviction: bool = field(default=True, metadata=cli_flag(   # on: by measurement
        "--disable-queue-aware-eviction", "evict what a waiting request will hit like anything "
        "else, instead of only when nothing else is evictable", negate=True))
    retract_policy: str = field(default="most-remaining", metadata=cli_flag(
        "--retract-policy", "which running request is retracted when decode runs out of KV",
        choices="radixkv.sched.policy:RETRACT_ORDERS"))
    retract_insert: bool = field(default=False, metadata=cli_flag(
        "--retract-insert", "insert a retracted request's computed KV into the cache"))
    init_new_token_ratio: float = field(default=0.7, metadata=cli_flag(
        "--init-new-token-ratio", "share of its remaining output a running request reserves"))
    min_new_token_ratio: float = field(default=0.1, metadata=cli_flag(
        "--min-new-token-ratio", "floor of that share"))
    new_token_ratio_decay: float = field(default=0.001, metadata=cli_flag(   # per decode step
        "--new-token-ratio-decay", "decrease of that share per decode step"))
    mixed_decode: bool = field(default=False, metadata=cli_flag(
        "--enable-mixed-chunk", "run decodes in the same step as a prefill"))
    shared_token_budget: bool = field(default=False, metadata=cli_flag(
        "--shared-token-budget", "with --enable-mixed-chunk, the running decodes take their "
        "tokens out of the step's prefill budget, as vLLM's one token budget does"))
    seed: int = field(default=0, metadata=cli_flag(                     # for the random policy
        "--seed", "seed of the workload generator, the random queue order, and generate's "
        "weights and sampling"))

    def __post_init__(self):
        from radixkv.sched.policy import QUEUE_ORDERS, RETRACT_ORDERS
        field_choice(self, "policy", "queue policy", QUEUE_ORDERS)
        field_choice(self, "retract_policy", "retract policy", RETRACT_ORDERS)
        fields_at_least(self, "max_prefill_tokens", "max_running_requests")
        fields_at_least(self, "chunked_prefill_size", "dedup_check_threshold", "dedup_hold_threshold",
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
