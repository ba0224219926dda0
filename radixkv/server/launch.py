"""Running the app under uvicorn: on a socket bound first (so `--port 0` gets a free port and
the real address is known before serving), in the foreground or in a thread (tests, benches).
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import signal
import socket
import threading
import time

import anyio
import uvicorn

from radixkv.server.connection import guarded_protocol
from radixkv.server.guard import DEFAULT_CLIENT_TIMEOUT


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: a free one); OSError names the address."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise OSError(e.errno, f"cannot listen on {host}:{port}: {e.strerror}") from None


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


DRAIN_MARGIN = 1.0       # seconds before the graceful shutdown's deadline that `drain` runs


class _Server(uvicorn.Server):
    """uvicorn's server, but SIGINT / SIGTERM end it with a normal exit (uvicorn re-raises
    the signal after its graceful shutdown, so the process would die of it). `exit_when`: an
    event any thread may set to stop it the same way. `drain` (a function or a coroutine
    function), called on the event loop DRAIN_MARGIN s before the graceful shutdown's deadline,
    ends what still runs then: a stream gets an error event rather than being cut off, and
    uvicorn has no task left to cancel."""

    def __init__(self, config: uvicorn.Config, drain=None,
                 exit_when: threading.Event | None = None, freeze_heap: bool = False):
        super().__init__(config)
        self.drain, self.exit_when, self.freeze_heap = drain, exit_when, freeze_heap
        self.ready = False       # startup done: listening, backend warm, heap frozen if asked

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        # what the first streamed response would otherwise import: anyio's asyncio backend
        # (starlette's task group; ~23 ms, which the first client waited)
        async with anyio.create_task_group():
            pass
        if self.freeze_heap and self.started:
            freeze_startup_heap()
        self.ready = self.started

    async def on_tick(self, counter: int) -> bool:
        if self.exit_when is not None and self.exit_when.is_set():
            self.should_exit = True
        return await super().on_tick(counter)

    def _drain_now(self) -> None:
        out = self.drain()
        if inspect.isawaitable(out):                 # a coroutine function: run it here
            asyncio.ensure_future(out)

    async def shutdown(self, sockets=None) -> None:
        late = None
        if self.drain is not None:
            grace = max((self.config.timeout_graceful_shutdown or 0) - DRAIN_MARGIN, 0)
            late = asyncio.get_running_loop().call_later(grace, self._drain_now)
        try:
            await super().shutdown(sockets)
        finally:
            if late is not None:
                late.cancel()

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        old = {s: signal.signal(s, self._on_signal) for s in sigs}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    def _on_signal(self, sig, frame) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True               # a second Ctrl-C: stop waiting for streams
        self.should_exit = True


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now (the imports, the app, its model or
    router) out of the cyclic collector's reach: a full collection then scans only what serving
    allocated, not the ~100,000 startup objects, whose scan stopped the event loop for ~26 ms
    every few hundred requests (vLLM's API server freezes its startup heap too). For a process
    that is the server: frozen objects that later form garbage cycles are never collected.
    Returns the objects frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _server(app, log_level: str, drain=None, exit_when=None,
            client_timeout: float = DEFAULT_CLIENT_TIMEOUT,
            freeze_heap: bool = False) -> uvicorn.Server:
    # request headers are due within client_timeout seconds (server/connection.py)
    return _Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                                  access_log=False, http=guarded_protocol(client_timeout)),
                   drain, exit_when, freeze_heap)


def serve_forever(app, sock: socket.socket, log_level: str = "warning", *, drain=None,
                  exit_when: threading.Event | None = None,
                  client_timeout: float = DEFAULT_CLIENT_TIMEOUT) -> None:
    """Serve until SIGINT / SIGTERM or `exit_when` is set, then a graceful shutdown (`drain`:
    see _Server). The process is the server's: once started, its heap is frozen
    (freeze_startup_heap)."""
    _server(app, log_level, drain, exit_when, client_timeout,
            freeze_heap=True).run(sockets=[sock])


class ServerThread:
    """`with ServerThread(app) as url:` — the app served on 127.0.0.1 on a free port, in a
    thread; stopped (and its engine with it) however the block ends."""

    def __init__(self, app, host: str = "127.0.0.1", log_level: str = "warning",
                 startup_timeout: float = 60.0, client_timeout: float = DEFAULT_CLIENT_TIMEOUT):
        self.sock = bind(host, 0)
        self.url = url_of(self.sock)
        self.server = _server(app, log_level, client_timeout=client_timeout)
        self._timeout = startup_timeout
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name="radixkv-http", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self.server.ready:          # listening, and warmed up
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server at {self.url} did not start")
            time.sleep(0.01)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(15)
        self.sock.close()

    def __exit__(self, *exc) -> None:
        self.stop()
