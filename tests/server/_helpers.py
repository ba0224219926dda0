"""Servers for the tests: built in-process, served on 127.0.0.1 on a free port, stopped however
the test ends."""
from __future__ import annotations

import contextlib
import threading
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


READ_S = 15.0                     # a stream that hangs fails its test at this read timeout


class Stream(threading.Thread):
    """One streamed completion (llama-3-8b, ignore_eos), read to its end in a thread: its data
    lines, the transport error that ended it (if any) and when it ended."""

    def __init__(self, url: str, prompt: str, max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.prompt, self.max_tokens = url, prompt, max_tokens
        self.lines: list[str] = []
        self.status, self.error, self.ended = None, None, None
        self.begun = threading.Event()

    def run(self) -> None:
        body = {"model": "llama-3-8b", "prompt": self.prompt, "max_tokens": self.max_tokens,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body,
                              timeout=httpx.Timeout(READ_S)) as r:
                self.status = r.status_code
                for ln in r.iter_lines():
                    if ln:
                        self.lines.append(ln)
                        self.begun.set()
        except httpx.HTTPError as e:
            self.error = e
        finally:
            self.ended = time.monotonic()
            self.begun.set()

    def started(self) -> "Stream":
        self.start()
        assert self.begun.wait(READ_S) and self.lines, (self.status, self.error)
        return self


def wait_for(what: str, cond, seconds: float, every: float = 0.02) -> float:
    """Poll `cond` until true; the seconds it took (an AssertionError past `seconds`)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < seconds, f"{what}: not within {seconds} s"
        time.sleep(every)
    return time.monotonic() - t0
