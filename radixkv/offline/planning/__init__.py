"""Capacity planning: hit rate against KV memory for a workload, and the cheapest deployment
(replicas, GPUs, cache, scheduler, router, aggregated or disaggregated) that meets an SLO on it."""
