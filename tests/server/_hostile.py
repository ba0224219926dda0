"""What the hostile-client tests share: a simulated server with a short --client-timeout and its
log records, raw sockets, and the inter-token latencies of concurrent streams."""
from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time

import httpx

from radixkv.config import CacheConfig, EngineConfig
from radixkv.server.app import build_app
from radixkv.server.build import SIM_OUTPUT, ServeOptions, build_server
from radixkv.server.launch import ServerThread
from tests.server._helpers import metric

MODEL, GPU = "llama-3-8b", "h200"
FILLER = SIM_OUTPUT.decode() * 2000          # what the simulated model writes, over and over
TIMEOUT = 2.0                                # --client-timeout in these tests (default 30 s)
ITL_RATIO = 2.0                              # others' p99 inter-token latency: at most this
ITL_SLACK = 0.010                            # times the baseline's, plus 10 ms of scheduling noise


class Logs(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def at_least(self, level: int) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records if r.levelno >= level]


@contextlib.contextmanager
def server(kv_capacity: int = 20_000, sndbuf: int | None = None, check_invariants: bool = True,
           **opts):
    """Yields (url, state, app, logs); `sndbuf`: the listening socket's SO_SNDBUF (accepted
    sockets inherit it, and the kernel stops growing their buffer), so a client that stops
    reading pauses the server's writes after ~100 KB rather than the ~4 MB autotuning allows."""
    opts.setdefault("client_timeout", TIMEOUT)
    cfg = EngineConfig(kv_capacity=kv_capacity, cache=CacheConfig(),
                       check_invariants=check_invariants)
    state = build_server(ServeOptions(executor="sim", model=MODEL, gpu=GPU, enable_metrics=True,
                                      **opts), cfg)
    app = build_app(state)
    srv = ServerThread(app, client_timeout=state.client_timeout)
    logs = Logs()                 # after uvicorn.Config, which configures its loggers
    watched = [logging.getLogger(n) for n in ("uvicorn", "radixkv.server")]
    for lg in watched:
        lg.addHandler(logs)
    try:
        if sndbuf is not None:
            srv.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        with srv as url:
            yield url, state, app, logs
    finally:
        srv.stop()
        for lg in watched:
            lg.removeHandler(logs)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def raw_socket(url: str, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:                        # before connect: it sets the TCP window
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(20)
    s.connect(("127.0.0.1", port_of(url)))
    return s


def post_bytes(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (b"POST /v1/completions HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(data), data))


def read_to_eof(s: socket.socket, limit: float = 20.0) -> bytes:
    """Everything until the server closes; fails if it does not within `limit` seconds."""
    s.settimeout(limit)
    out = bytearray()
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            return bytes(out)
        out += chunk


def sse_texts(raw: bytes) -> tuple[list[str], list]:
    """(the texts, the finish reasons) of a completion stream's whole events in `raw`."""
    texts, reasons = [], []
    for event in raw.split(b"\n\n")[:-1]:            # the last piece may be cut off
        line = event.split(b"\r\n")[-1].split(b"\n")[-1]
        if line.startswith(b"data: {"):
            choice = json.loads(line[6:])["choices"][0]
            texts.append(choice["text"])
            reasons.append(choice["finish_reason"])
    return texts, reasons


def stream_itls(url: str, n: int, tokens: int) -> list[float]:
    """n concurrent streams of `tokens` tokens each; their inter-token gaps (s), all together."""
    gaps: list[float] = []
    errors: list[BaseException] = []

    def one():
        try:
            body = {"prompt": "hi", "max_tokens": tokens, "ignore_eos": True, "stream": True}
            last = None
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(now - last)
                        last = now
        except BaseException as e:             # reported in the test's thread
            errors.append(e)
    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(gaps) >= n * (tokens - 2)
    return gaps


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def aborted(url: str) -> float:
    return metric(url, "radixkv_aborted_requests_total")


def wait_until(cond, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
