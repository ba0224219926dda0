"""Prometheus text format, parsed: the leaf both the load client (bench/) and the gateway read
workers' and servers' /metrics with."""
from __future__ import annotations


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> sample name -> value summed over its label sets, for counters,
    gauges and untyped samples (a counter `x` appears as `x_total`)."""
    from prometheus_client.parser import text_string_to_metric_families
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type in ("counter", "gauge", "untyped", "unknown"):
            for s in fam.samples:
                out[s.name] = out.get(s.name, 0.0) + float(s.value)
    return out
