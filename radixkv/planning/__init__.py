"""Capacity planning: hit rate against KV memory for a workload."""
