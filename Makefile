# Two entry points: `make run` (the main job on its default) and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: run test test-slow test-fast lint typecheck load soak interop real-engine install bench peers clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[torch,test,ray]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/radixkv compare

test: $(STAMP)
	$(BIN)/python -m pytest -q

# the cases over ten seconds each that `test` leaves out (marked `long`: the GPU check's dry run,
# the short soak, a thousand requests on a small pool, Ray Serve's replicas), about three minutes
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m long

# the inner loop (under two minutes): the layering test, the argument checks and the core rooms
# (cache, scheduler, workloads, KV events, the simulated GPU, the routers, offline replay),
# less the long hypothesis state machines and the Mooncake trace runs that `make test` keeps
FAST := tests/test_layering.py tests/test_argcheck.py tests/cache tests/sched tests/workloads \
        tests/kvevents tests/sim tests/router tests/offline/test_replay.py
FAST_SKIP := not runTest and not pruning_early_or_late and not mooncake
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q $(FAST) -k '$(FAST_SKIP)'

lint: $(STAMP)
	$(BIN)/ruff check radixkv tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# the 60-second server load run (200 streaming clients, a tenth hanging up), a Ray Serve
# replica killed mid-stream and Ray Serve stopped by SIGINT (about a minute each, most of it Ray
# starting), kept out of `test`
load: $(STAMP)
	$(BIN)/python -m pytest -q -s -m slow tests/server/test_load.py tests/server/test_ray_replica_kill.py tests/server/test_shutdown.py

# ten minutes of open-loop traffic at about 80 % of the sim server's measured capacity, with
# hang-ups and retractions: no error, no leak, memory flat, the counters equal the clients'
soak: $(STAMP)
	$(BIN)/python -m pytest -q -s -m soak tests/server/test_soak.py

# the peers' own tools (routers, benchmark clients) against radixkv serve, each installed into a
# venv of its own under .interop/ (kept between runs)
interop: $(STAMP)
	$(BIN)/python tests/interop/install.py
	$(BIN)/python -m pytest -q -m interop tests/interop

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_cache.py

# the peers the speed benchmarks set radixkv beside (SGLang's tree, vLLM's KVCacheManager,
# DynoSim), each installed into a venv of its own under .peers/ (kept between runs)
peers: $(STAMP)
	$(BIN)/python benchmarks/peers.py

clean:
	rm -rf $(VENV) build *.egg-info

# vLLM's CPU build (exact pins) in a venv of its own under .peers/ and the tiny checkpoint it
# serves, both kept between runs, then the tests that drive real vLLM workers of it
real-engine: $(STAMP)
	$(BIN)/python tests/realengine/install.py
	$(BIN)/python -m pytest -q -m real_engine tests/realengine
