"""Running the app under uvicorn: on a socket bound first (so `--port 0` gets a free port and
the real address is known before serving), in the foreground or in a thread (tests, benches).
"""
from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time

import uvicorn


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


class _Server(uvicorn.Server):
    """uvicorn's server, but SIGINT / SIGTERM end it with a normal exit (uvicorn re-raises
    the signal after its graceful shutdown, so the process would die of it)."""

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


def _server(app, log_level: str) -> uvicorn.Server:
    return _Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5,
                                         access_log=False))


def serve_forever(app, sock: socket.socket, log_level: str = "warning") -> None:
    """Serve until SIGINT / SIGTERM (uvicorn's handlers: a graceful shutdown)."""
    _server(app, log_level).run(sockets=[sock])


class ServerThread:
    """`with ServerThread(app) as url:` — the app served on 127.0.0.1 on a free port, in a
    thread; stopped (and its engine with it) however the block ends."""

    def __init__(self, app, host: str = "127.0.0.1", log_level: str = "warning",
                 startup_timeout: float = 60.0):
        self.sock = bind(host, 0)
        self.url = url_of(self.sock)
        self.server = _server(app, log_level)
        self._timeout = startup_timeout
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                        name="radixkv-http", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self.server.started:
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
