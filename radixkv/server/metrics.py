"""Prometheus metrics of one server, under vLLM's names with SGLang's as aliases.

Each server owns a CollectorRegistry (several servers can live in one process, as in tests).
The engine thread updates everything; the HTTP thread only renders. Token counters are
counted once per request at its first admission: a prefill recomputed after a retraction is
not a hit, and not a second query. `sglang:cache_hit_rate` is hits / queries of the counters
(over the server's life), not a per-batch gauge. With KV events on,
`radixkv_kv_events_dropped_total` is read from the publisher at each scrape: batches it dropped
because its queue to the sending thread was full.
"""
from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily

disable_created_metrics()          # no *_created series, as vLLM

# latency buckets (seconds) as vLLM's
_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
        5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_E2E = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        lab, val = ["model_name"], [model_name]

        def counter(name, doc):
            return Counter(name, doc, lab, registry=r).labels(*val)

        def gauge(name, doc):
            return Gauge(name, doc, lab, registry=r).labels(*val)

        def hist(name, doc, buckets):
            return Histogram(name, doc, lab, buckets=buckets, registry=r).labels(*val)

        self.queries = counter("vllm:prefix_cache_queries",
                               "Prompt tokens looked up in the prefix cache (first admission)")
        self.hits = counter("vllm:prefix_cache_hits",
                            "Prompt tokens found in the prefix cache (first admission)")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated")
        self.success = counter("vllm:request_success", "Requests finished")
        self.aborted = counter("radixkv_aborted_requests", "Requests aborted (client gone)")
        self.failed = counter("radixkv_failed_requests",
                              "Requests ended with an error: the engine failed or shut down")
        self.evicted = counter("radixkv_evicted_tokens", "KV tokens evicted from the prefix cache")
        self.resets = counter("radixkv_cache_resets",
                              "Prefix cache resets (/flush_cache, /reset_prefix_cache)")
        self.retractions = counter("radixkv_retractions",
                                   "Running requests retracted under memory pressure")
        self.running = gauge("vllm:num_requests_running", "Requests running (prefill or decode)")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be admitted")
        self.usage = gauge("vllm:kv_cache_usage_perc",
                           "Share of KV slots in use by requests (cached but evictable excluded)")
        self.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token", _TTFT)
        self.itl = hist("vllm:inter_token_latency_seconds", "Time between output tokens", _ITL)
        self.e2e = hist("vllm:e2e_request_latency_seconds", "Arrival to finish", _E2E)
        self.queue = hist("vllm:request_queue_time_seconds", "Arrival to first admission", _E2E)
        # SGLang's names for the same figures
        self.s_queue = gauge("sglang:num_queue_reqs", "Requests waiting (SGLang's name)")
        self.s_running = gauge("sglang:num_running_reqs", "Requests running (SGLang's name)")
        self.s_usage = gauge("sglang:token_usage", "KV usage share (SGLang's name)")
        hit_rate = Gauge("sglang:cache_hit_rate", "Prefix cache hits / queries, from the counters",
                         lab, registry=r)
        hit_rate.labels(*val).set_function(self.hit_rate)
        self._hits = self._queries = 0
        self._model = model_name

    def hit_rate(self) -> float:
        return self._hits / self._queries if self._queries else 0.0

    # ---- called by the engine thread -------------------------------------------------------------
    def first_admit(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._queries += prompt_tokens
        self._hits += cached_tokens
        self.queries.inc(prompt_tokens)
        self.hits.inc(cached_tokens)
        self.prompt_tokens.inc(prompt_tokens)

    def tokens(self, n: int, interval: float | None) -> None:
        """`n` new output tokens of one request; `interval` since its previous token, if any."""
        self.generation_tokens.inc(n)
        if interval is not None:
            for _ in range(n):
                self.itl.observe(interval / n)

    def finished(self, ttft: float, e2e: float, queue: float) -> None:
        self.success.inc()
        self.ttft.observe(ttft)
        self.e2e.observe(e2e)
        self.queue.observe(queue)

    def cache_config(self, block_size: int, num_blocks: int, hash_algo: str,
                     prefix_caching: bool) -> None:
        """vLLM's `vllm:cache_config_info`: a gauge at 1 whose labels are the cache's
        configuration (what llm-d reads a worker's block size and block count from)."""
        info = {"block_size": str(block_size), "num_gpu_blocks": str(num_blocks),
                "num_cpu_blocks": "None", "enable_prefix_caching": str(prefix_caching),
                "prefix_caching_hash_algo": hash_algo, "cache_dtype": "auto", "engine": "0"}
        Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(info),
              registry=self.registry).labels(**info).set(1)

    def kv_events(self, publisher) -> None:
        """Expose the KV event publisher's `dropped` count (read at each scrape)."""
        model = self._model

        class Dropped:
            def collect(self):
                fam = CounterMetricFamily("radixkv_kv_events_dropped", "KV event batches dropped "
                                          "because the publisher's queue was full",
                                          labels=["model_name"])
                fam.add_metric([model], publisher.dropped)
                yield fam
        self.registry.register(Dropped())

    def gauges(self, running: int, waiting: int, usage: float) -> None:
        """The engine's state now: set after every change (admission, step, abort, flush)."""
        for g, v in ((self.running, running), (self.s_running, running),
                     (self.waiting, waiting), (self.s_queue, waiting),
                     (self.usage, usage), (self.s_usage, usage)):
            g.set(v)

    def step(self, evicted: int, retractions: int) -> None:
        if evicted:
            self.evicted.inc(evicted)
        if retractions:
            self.retractions.inc(retractions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
