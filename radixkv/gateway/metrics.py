"""The gateway's own Prometheus metrics: requests per worker, retries, errors, the routing
decision's time, healthy workers, and the cached tokens it predicted against those the workers
reported in `usage`."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_DECISION = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1)


class GatewayMetrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("radixkv_route_requests", "Requests sent, per worker", ["worker"],
                                registry=r)
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

    def render(self) -> bytes:
        return generate_latest(self.registry)
