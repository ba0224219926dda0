"""The cluster simulator: replicas of the simulated engine behind one of the routers (router/),
aggregated (simulator) or with prefill and decode apart (disagg), the side-by-side run of several
routers (compare) and the results they report (results)."""
