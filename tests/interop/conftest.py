"""The interop tests: the peers' own tools against `radixkv serve --executor sim` on 127.0.0.1.
Every test module here is marked `interop` (run by `make interop`, not `make test`); a test skips,
naming the tool, when that tool's venv is not installed."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

from radixkv.bench.process import ServerProcess
from radixkv.cli import main
from tests.interop.peers import PEERS, installed, program

MODEL = "llama-3-8b"


def tool(name: str) -> str:
    if not installed(name):
        pytest.skip(f"{PEERS[name].requirement} is not installed: run `make interop`")
    return str(program(name))


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """The served model's tokenizer as the clients load it (`radixkv tokenizer`)."""
    out = tmp_path_factory.mktemp("tokenizer")
    assert main(["tokenizer", str(out), "--model", MODEL]) == 0
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker(NamedTuple):
    url: str
    events: str | None          # its KV-event PUB endpoint, when events are on


@contextlib.contextmanager
def workers(n: int, *flags: str, events: bool = False, tokens: int = 20_000):
    """n sim servers of MODEL, metrics on, each with its own KV pool of `tokens`."""
    args = ["--executor", "sim", "--model", MODEL, "--enable-metrics",
            "--max-total-tokens", str(tokens), *flags]
    if events:
        args += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*"})]
    with contextlib.ExitStack() as stack:
        out = []
        for _ in range(n):
            srv = stack.enter_context(ServerProcess(args, startup_timeout=120))
            info = httpx.get(f"{srv.base_url}/server_info", timeout=10).json()
            out.append(Worker(srv.base_url, info["kv_events"]["endpoint"] if events else None))
        yield out


@contextlib.contextmanager
def running(cmd: list[str], ready_url: str, log: Path, timeout: float = 90.0):
    """A peer's process in a session of its own, ready once `ready_url` answers 200; stopped
    (SIGTERM, then SIGKILL) however the block ends. Its output goes to `log`."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, f"{cmd[0]} exited: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"{cmd[0]} not ready: {log.read_text()[-2000:]}"
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def counter(url: str, name: str) -> float:
    """The value of one series of /metrics (0 when absent)."""
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
