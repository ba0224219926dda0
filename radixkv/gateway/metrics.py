"""The gateway's own Prometheus metrics: requests per worker, retries, errors, the routing
decision's time, healthy workers, the cached tokens it predicted against those the workers
reported in `usage`, the TTFT it measured on streams, and (with a fitted TTFT) how the
prediction tracks it and the fit's coefficients; per worker fed by KV events, the batches
lost for good, repaired through replay, the gaps and resyncs (since its feed began: a fleet
change starts the feeds afresh), and the prompts sent whose first page its events then held or
did not (a worker whose events never hold one carries other hashes: gateway/hash_check.py)."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_TTFT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_DECISION = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)


_FEED = (("batches", "KV event batches received from the worker"),
         ("gaps", "Sequence gaps seen in the worker's KV events"),
         ("missed", "KV event batches lost for good (not repaired through replay)"),
         ("replayed", "KV event batches repaired through the worker's replay socket"),
         ("resyncs", "Losses that made the gateway forget the worker's pages"))


class _FeedCollector:
    """The feeds' own counts, read at each scrape."""

    def __init__(self):
        self.counts: dict = {}                    # worker url -> FeedCounts
        self.checks: dict = {}                    # worker url -> HashCounts

    def collect(self):
        for field, doc in _FEED:
            fam = CounterMetricFamily(f"radixkv_route_kv_events_{field}", doc, labels=["worker"])
            for url, c in sorted(self.counts.items()):
                fam.add_metric([url], getattr(c, field))
            yield fam
        fam = GaugeMetricFamily("radixkv_route_kv_events_caught_up", "1 once the worker's "
                                "buffered KV event history has been replayed", labels=["worker"])
        for url, c in sorted(self.counts.items()):
            fam.add_metric([url], float(c.caught_up))
        yield fam
        for field, doc in (("found", "Prompts sent whose first page the worker's KV events "
                                     "then held"),
                           ("missing", "Prompts sent whose first page its KV events did not "
                                       "hold")):
            fam = CounterMetricFamily(f"radixkv_route_kv_events_prompts_{field}", doc,
                                      labels=["worker"])
            for url, c in sorted(self.checks.items()):
                fam.add_metric([url], getattr(c, field))
            yield fam
        fam = GaugeMetricFamily("radixkv_route_kv_events_hash_mismatch", "1 when none of the "
                                "prompts checked showed up in the worker's KV events (other "
                                "hashes, or no events): its predictions are all 0",
                                labels=["worker"])
        for url, c in sorted(self.checks.items()):
            fam.add_metric([url], float(c.mismatch))
        yield fam


class GatewayMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("radixkv_route_requests", "Requests sent, per worker", ["worker"],
                                registry=r)
        self.tokenized = Counter("radixkv_route_tokenize_requests", "Requests tokenized by "
                                 "each worker's own endpoints", ["worker"], registry=r)
        self.retries = Counter("radixkv_route_retries", "Requests retried on another worker "
                               "after a failure before the first byte", registry=r)
        self.errors = Counter("radixkv_route_errors", "Requests that ended in a gateway error",
                              ["kind"], registry=r)
        self.decision = Histogram("radixkv_route_decision_seconds", "Time of one routing decision",
                                  buckets=_DECISION, registry=r)
        self.healthy = Gauge("radixkv_route_workers_healthy", "Workers in the rotation", registry=r)
        self.workers = Gauge("radixkv_route_workers", "Workers known", registry=r)
        self.predicted = Counter("radixkv_route_predicted_cached_tokens",
                                 "Prompt tokens the gateway expected the chosen worker to hold",
                                 registry=r)
        self.reported = Counter("radixkv_route_reported_cached_tokens",
                                "Cached prompt tokens the workers reported in usage", registry=r)
        self.ttft = Histogram("radixkv_route_ttft_seconds", "Time to the first content of a "
                              "stream, from the request's arrival", buckets=_TTFT, registry=r)
        self.fit_error = Gauge("radixkv_route_ttft_fit_abs_error", "|predicted / measured TTFT "
                               "- 1| over the fit's window, each predicted at routing",
                               ["quantile"], registry=r)
        self.fit_coef = Gauge("radixkv_route_ttft_fit_coefficient", "The fitted TTFT's "
                              "coefficient of each feature", ["feature"], registry=r)
        self.fit_seen = Gauge("radixkv_route_ttft_fit_observations", "TTFTs the fit has seen",
                              registry=r)
        self._feeds = _FeedCollector()
        r.register(self._feeds)

    def render(self, quality=None, feeds: dict | None = None,
               checks: dict | None = None) -> bytes:
        """The exposition; `quality` (a ttft_fit.FitQuality) refreshes the fit's gauges, `feeds`
        (worker url -> feeds.FeedCounts) the KV event counters, `checks` (worker url ->
        hash_check.HashCounts) the prompts found in them."""
        if feeds is not None:
            self._feeds.counts = dict(feeds)
        if checks is not None:
            self._feeds.checks = dict(checks)
        if quality is not None:
            self.fit_seen.set(quality.observations)
            self.fit_error.labels("0.5").set(quality.median_abs_error)
            self.fit_error.labels("0.9").set(quality.p90_abs_error)
            for k, v in quality.coefficients.items():
                self.fit_coef.labels(k).set(v)
        return generate_latest(self.registry)
