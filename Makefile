# Two entry points: `make run` (the main job on its default) and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: run test install bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[torch,test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/radixkv compare

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_cache.py

clean:
	rm -rf $(VENV) build *.egg-info
