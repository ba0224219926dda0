"""The real-engine tests: vLLM's CPU build serving the tiny checkpoint on 127.0.0.1. Every test
here is marked `real_engine` (run by `make real-engine`, left out of `make test`), and all of
them skip, naming `make real-engine`, when the engine or its checkpoint is not installed."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.realengine.events import Subscriber
from tests.realengine.workers import TOPIC, VllmWorkers, Worker, skip_reason

HERE = Path(__file__).resolve().parent


# first, so that `-m` deselection (the mark plugin's own hook) sees the marker
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.real_engine)


@pytest.fixture(scope="session", autouse=True)
def real_engine() -> None:
    """Skips the room when vLLM CPU or the tiny checkpoint is missing (session-scoped, so it
    runs before any fixture starts a worker)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def worker(real_engine, tmp_path_factory) -> Worker:
    """One worker, KV events on, a pool of 8,192 tokens (256 blocks), for the module."""
    with VllmWorkers(1, kv_tokens=8192, log_dir=tmp_path_factory.mktemp("vllm")) as ws:
        yield ws[0]


@pytest.fixture(scope="module")
def subscriber(worker: Worker) -> Subscriber:
    """The worker's KV events from before its first request on."""
    sub = Subscriber(worker.events, TOPIC)
    yield sub
    sub.close()
