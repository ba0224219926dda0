"""The four-way experiment's parts: the four `radixkv serve` configurations, the shared-prefix
workload every one of them gets, and one configuration's row (what the client saw beside what
the server's /metrics counted over the run). `radixkv four-way` runs it."""
from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

from radixkv.bench.client import BenchResult
from radixkv.shapes import MODEL_CONFIGS
from radixkv.argcheck import positive_int
from radixkv.workloads import Workload, make_workload

CONFIGS: dict[str, list[str]] = {
    "default": [],
    "lpm-slru": ["--schedule-policy", "lpm", "--radix-eviction-policy", "slru"],
    "page16": ["--page-size", "16"],
    "no-cache": ["--disable-radix-cache"],
}
DEFAULT_MODEL = {"torch": "tiny-llama", "sim": "llama-3-8b"}
# few-shot sizes: a byte-level model on a CPU serves the small one in seconds per server; the
# large one is a realistic few-shot load (a 4k-token preamble, 200 questions)
FEWSHOT = {
    "small": dict(num_questions=64, preamble_len=1024, question_len=(16, 64),
                  output_len=(16, 64), vocab_size=256),
    "large": dict(num_questions=200, preamble_len=4000, question_len=(20, 200),
                  output_len=(50, 200), vocab_size=32000),
}
QUERIES, HITS = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
EVICTED, RETRACTIONS = "radixkv_evicted_tokens_total", "radixkv_retractions_total"



def make_fewshot_workload(name: str, model: str, num_prompts: int | None, rate: float,
                          seed: int, preambles: int = 1) -> Workload:
    """The workload every configuration gets; token ids within the model's vocabulary. With
    `preambles` > 1 (fewshot only), that many few-shot workloads (seeds seed, seed+1, ...: each
    its own preamble) share the questions and are interleaved in a seeded random order."""
    positive_int(preambles, "--preambles")
    vocab = _vocab(model)
    size = FEWSHOT["small" if vocab < 1000 else "large"]
    if preambles > 1:
        if name != "fewshot":
            raise ValueError(f"--preambles applies to the fewshot workload, not {name!r}")
        total = num_prompts or size["num_questions"]
        if total < preambles:
            raise ValueError(f"--num-prompts {total} is fewer than --preambles {preambles}")
        parts = [make_fewshot_workload(name, model, total // preambles + (k < total % preambles),
                                       math.inf, seed + k) for k in range(preambles)]
        reqs = [dataclasses.replace(r, id=f"pre{k}-{r.id}") for k, w in enumerate(parts)
                for r in w.requests]
        random.Random(seed).shuffle(reqs)
        gap = 0.0 if math.isinf(rate) else 1.0 / rate
        reqs = [dataclasses.replace(r, arrival=i * gap) for i, r in enumerate(reqs)]
        return Workload(f"fewshot x{preambles} preambles", reqs,
                        meta={**parts[0].meta, "preambles": preambles, "num_questions": total})
    kw: dict[str, Any] = {"seed": seed, "vocab_size": min(size["vocab_size"], vocab),
                          "rate": None if math.isinf(rate) else rate}
    if name == "fewshot":
        kw.update({k: v for k, v in size.items() if k != "vocab_size"})
        if num_prompts is not None:
            kw["num_questions"] = num_prompts
    w = make_workload(name, **kw)
    if num_prompts is not None and len(w) > num_prompts:
        w = Workload(w.name, w.requests[:num_prompts], w.skipped, w.block_size, w.meta)
    return w


def _vocab(model: str) -> int:
    return MODEL_CONFIGS[model].vocab_size if model in MODEL_CONFIGS else 32000


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> int | None:
    if key not in after:
        return None
    return round(after[key] - before.get(key, 0.0))


def make_row(name: str, result: BenchResult, before: dict[str, float],
             after: dict[str, float]) -> dict:
    """One configuration's figures: the client's summary and the server's counters over the
    run (after - before)."""
    s = result.summary
    queries, hits = _delta(before, after, QUERIES), _delta(before, after, HITS)
    return {
        "name": name, "flags": " ".join(CONFIGS[name]),
        "requests": s["requests"], "completed": s["completed"], "errors": s["errors"],
        "prompt_tokens": s["prompt_tokens"], "cached_tokens": s["cached_tokens"],
        "hit_rate": hits / queries if queries and hits is not None else None,
        "queried_tokens": queries, "hit_tokens": hits,
        "prefill_tokens": None if queries is None or hits is None else queries - hits,
        "evicted_tokens": _delta(before, after, EVICTED),
        "retractions": _delta(before, after, RETRACTIONS),
        "ttft_p50": s["ttft_p50"], "ttft_p99": s["ttft_p99"], "e2e_p99": s["e2e_p99"],
        "output_tok_s": s["output_tok_s"], "details": s,
    }
