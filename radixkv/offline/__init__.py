"""The offline wing: everything that runs a workload without a server. At this level the
sequential cache replay (replay) and the engine on the simulated GPU (simulate); below it the
cluster simulator (cluster/), capacity curves and the deployment search (planning/), the real
executor timed against the simulator (calibration/) and the pictures (plots/)."""
