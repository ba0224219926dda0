"""A `radixkv serve` subprocess: started on a free port of 127.0.0.1, ready once it prints its
"listening on" line, stopped with SIGTERM (then SIGKILL); and its /metrics, scraped into
plain numbers."""
from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
import threading
from typing import Sequence

import httpx

from radixkv.promtext import parse_metrics

LISTENING = re.compile(r"radixkv serve: listening on (https?://\S+)")
# lines of the server's stderr an error message quotes
STDERR_TAIL = 8


class ServerProcess:
    """`with ServerProcess(["--executor", "sim", ...]) as srv:` starts
    `python -m radixkv serve ARGS --host 127.0.0.1 --port 0` and waits up to
    `startup_timeout` seconds for it to listen (srv.base_url); the block's end stops it,
    however the block ends. A server that exits or stays silent raises an OSError quoting
    the end of its stderr."""

    def __init__(self, args: Sequence[str], startup_timeout: float = 120.0,
                 stop_timeout: float = 10.0):
        self.cmd = [sys.executable, "-m", "radixkv", "serve", *args,
                    "--host", "127.0.0.1", "--port", "0"]
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.base_url: str | None = None
        self.stdout: collections.deque[str] = collections.deque(maxlen=200)
        self._ready = threading.Event()
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ServerProcess:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> str:
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self._stderr, text=True, encoding="utf-8",
                                     errors="replace")
        self._reader = threading.Thread(target=self._read_stdout, daemon=True)
        self._reader.start()
        waited = 0.0
        while not self._ready.wait(0.1):
            waited += 0.1
            if self.proc.poll() is not None:
                raise ChildProcessError(f"{self.name} exited with status "
                                        f"{self.proc.returncode} before listening; its "
                                        f"stderr ends: {self.stderr_tail()}")
            if waited >= self.startup_timeout:
                raise TimeoutError(f"{self.name} printed no 'listening on' line within "
                                   f"{self.startup_timeout:g} s; its stderr ends: "
                                   f"{self.stderr_tail()}")
        return self.base_url

    @property
    def name(self) -> str:
        return "radixkv serve " + " ".join(self.cmd[4:])

    def _read_stdout(self) -> None:
        # keeps draining after the ready line, so a chatty server never blocks on its pipe
        for line in self.proc.stdout:
            self.stdout.append(line.rstrip("\n"))
            m = LISTENING.search(line)
            if m and not self._ready.is_set():
                self.base_url = m.group(1).rstrip("/")
                self._ready.set()

    def stderr_tail(self, lines: int = STDERR_TAIL) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        tail = [ln.rstrip() for ln in self._stderr.read().splitlines() if ln.strip()][-lines:]
        return " | ".join(tail) or "(nothing)"

    def stop(self) -> int | None:
        """SIGTERM, wait up to stop_timeout seconds, then SIGKILL; the exit status."""
        p = self.proc
        if p is None:
            return None
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self._reader.join(2.0)              # the pipe is at its end once the server is gone
        if p.stdout is not None and not self._reader.is_alive():
            p.stdout.close()
        self._stderr.close()
        self.proc = None
        return p.returncode


def scrape_metrics(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """GET base_url/metrics, parsed by parse_metrics."""
    try:
        resp = httpx.get(f"{base_url}/metrics", timeout=timeout)
    except httpx.HTTPError as e:
        raise ConnectionError(f"cannot read {base_url}/metrics: {type(e).__name__}: {e}") \
            from None
    if resp.status_code != 200:
        raise ConnectionError(f"GET {base_url}/metrics answered HTTP {resp.status_code} "
                              f"(was the server started with --enable-metrics?)")
    return parse_metrics(resp.text)
