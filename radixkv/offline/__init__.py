"""Offline runs of a workload, without a server: the sequential cache replay and the engine on
the simulated GPU (one configuration, or several side by side)."""
