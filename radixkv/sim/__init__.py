"""The simulated GPU: named model and GPU specs, the cost model that prices a step, the
SimExecutor, and the future-aware oracle for Belady eviction. Never imports torch."""
