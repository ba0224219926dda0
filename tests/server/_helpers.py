"""Servers for the tests: built in-process, served on 127.0.0.1 on a free port, stopped however
the test ends."""
from __future__ import annotations

import contextlib
import time

import httpx
import openai

from radixkv.config import CacheConfig, EngineConfig
from radixkv.server.app import build_app
from radixkv.server.build import ServeOptions, build_server
from radixkv.server.launch import ServerThread


@contextlib.contextmanager
def running_server(kv_capacity: int = 20_000, cache: CacheConfig | None = None,
                   check_invariants: bool = True, **opts):
    """Yields (base url, ServerState)."""
    opts.setdefault("enable_metrics", True)
    cfg = EngineConfig(kv_capacity=kv_capacity, cache=cache or CacheConfig(),
                       check_invariants=check_invariants)
    state = build_server(ServeOptions(**opts), cfg)
    with ServerThread(build_app(state)) as url:
        yield url, state


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def metric(url: str, name: str) -> float:
    """One sample's value from /metrics (the first series of that name)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def on_engine(state, fn):
    """fn(engine) on the engine thread, between steps."""
    return state.worker.call(fn).result(timeout=30)


def wait_idle(state, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while on_engine(state, lambda e: e.has_work()):
        if time.monotonic() > deadline:
            raise AssertionError("the engine did not go idle")
        time.sleep(0.02)


def check_clean(state) -> dict:
    """No request holds anything; conservation and locks checked; returns the live stats."""
    def check(e):
        e.manager.check()
        return {"holders": len(e.manager.holders()), "used": e.pool.used(),
                "tree": e.cache.total_size(), "evictable": e.cache.evictable_size(),
                "protected": e.cache.protected_size()}
    s = on_engine(state, check)
    assert s["holders"] == 0 and s["protected"] == 0, s
    assert s["used"] == s["tree"], s           # every used slot is the tree's
    return s
