"""Engine presets: the cache and scheduler settings an engine ships with, so that a simulation
runs the engine a user deploys (`--engine vllm|sglang`). Each value names its source in the
engine's code (docs/engines.md has the table); a flag given on the command line wins.

Values are config field names (radixkv.config: CacheConfig, SchedulerConfig) and depend on the
GPU where the engine's own defaults do (its memory) and on the KV pool (SGLang sizes its
running-request cap from it).
"""
from __future__ import annotations

from dataclasses import dataclass

from radixkv.registry import Registry

GiB = 1 << 30
LLAMA_3_1_CONTEXT = 131072     # max_position_embeddings of Llama 3.1, SGLang's context_len


@dataclass(frozen=True)
class EngineDefaults:
    """What a preset sets: the cache (kind and page), the scheduler fields, and the timing
    tables that price the engine's steps."""
    engine: str
    cache: str
    page_size: int
    sched: dict
    timing: str


ENGINES: Registry = Registry("engine")


@ENGINES.register("vllm")
def vllm(gpu_bytes: int, gpu_name: str, kv_tokens: int) -> EngineDefaults:
    # vllm/engine/arg_utils.py (0.33.0) _set_default_max_num_seqs_and_batched_tokens_args,
    # the OpenAI server's row: >= 160 GiB 16384 / 1024; >= 70 GiB and not A100: 8192 / 1024;
    # else 2048 / 256
    if gpu_bytes >= 160 * GiB:
        tokens, seqs = 16384, 1024
    elif gpu_bytes >= 70 * GiB and "a100" not in gpu_name:
        tokens, seqs = 8192, 1024
    else:
        tokens, seqs = 2048, 256
    return EngineDefaults(
        "vllm", cache="blockhash",
        page_size=16,                      # vllm/config/cache.py: DEFAULT_BLOCK_SIZE = 16
        sched=dict(
            policy="fcfs",                 # vllm/config/scheduler.py: policy "fcfs"
            max_prefill_tokens=tokens,     # max_num_batched_tokens: the step's token budget
            chunked_prefill_size=tokens,   # chunked prefill always on in V1: a chunk fills it
            max_running_requests=seqs,     # max_num_seqs
            mixed_decode=True,             # V1 schedules running requests first, then prefills
            shared_token_budget=True,      # ... all of them out of the one token budget
            dedup=False,                   # no in-batch prefix dedup in vLLM
            queue_aware_eviction=False),   # the free queue evicts in LRU order only
        timing="vllm")


@ENGINES.register("sglang")
def sglang(gpu_bytes: int, gpu_name: str, kv_tokens: int) -> EngineDefaults:
    # sglang/srt/arg_groups/memory_hook.py (0.5.23) _handle_gpu_memory_settings: the chunk by
    # GPU memory tier
    mib = gpu_bytes / (1 << 20)
    chunk = 2048 if mib < 35 * 1024 else 4096 if mib < 60 * 1024 else \
        8192 if mib < 160 * 1024 else 16384
    # sglang/srt/model_executor/pool_configurator.py _resolve_max_running_requests_per_worker:
    # tokens / context_len * 512, clamped to [2048, 4096], at most half the tokens
    running = min(max(min(int(kv_tokens / LLAMA_3_1_CONTEXT * 512), 4096), 2048),
                  max(1, kv_tokens // 2))
    return EngineDefaults(
        "sglang", cache="radix",
        page_size=1,                       # page_size None -> 1 on CUDA attention backends
        sched=dict(
            policy="fcfs",                 # arg_groups/fields/schedule.py: schedule_policy
            max_prefill_tokens=16384,      # ... max_prefill_tokens
            chunked_prefill_size=chunk,
            max_running_requests=running,
            mixed_decode=False,            # ... enable_mixed_chunk False
            shared_token_budget=False,
            dedup=True,                    # in-batch prefix caching, thresholds 32 / 32
            queue_aware_eviction=False),   # radix_eviction_policy "lru", nothing else
        timing="sglang")


def engine_defaults(name: str, gpu_bytes: int, gpu_name: str, kv_tokens: int) -> EngineDefaults:
    """The preset `name` for a GPU of gpu_bytes memory and a pool of kv_tokens."""
    return ENGINES.get(name)(gpu_bytes, gpu_name, kv_tokens)
