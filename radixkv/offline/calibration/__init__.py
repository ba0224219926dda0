"""Calibration: the real executor's steps timed and fitted into a simulator profile, and the
profiled simulator compared with the real engine on one workload (fidelity)."""
