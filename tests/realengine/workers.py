"""Real vLLM CPU workers for the tests: where the engine and its checkpoint live, whether they are
installed, and `VllmWorkers`, which starts n `vllm serve` processes of the tiny checkpoint on
127.0.0.1, each pinned to a core, and stops every one of their processes by process group
however the block ends.

The paths may be moved with RADIXKV_VLLM_CPU (the engine's venv, default .peers/vllm-cpu) and
RADIXKV_TINY_LLAMA (the checkpoint, default .peers/tiny-llama)."""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import httpx

from tests.realengine import checkpoint

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VENV = Path(os.environ.get("RADIXKV_VLLM_CPU", ROOT / ".peers" / "vllm-cpu"))
MODEL = Path(os.environ.get("RADIXKV_TINY_LLAMA", ROOT / ".peers" / "tiny-llama"))
ENGINE_PYTHON = VENV / "bin" / "python"
VLLM = VENV / "bin" / "vllm"
REQUIREMENTS = HERE / "vllm_cpu.txt"
INSTALL_STAMP = VENV / ".radixkv-installed"
VLLM_VERSION = "0.32.0+cpu"
SERVED_NAME = "tiny-llama"
TOPIC = "kv-events"

# the checkpoint's KV cache a token: 4 layers x (K, V) x 2 KV heads x head_dim 64 x 2 bytes (bf16)
KV_BYTES_PER_TOKEN = 4 * 2 * 2 * 64 * 2
# vLLM's CPU attention takes only block sizes that are multiples of 32
BLOCK_SIZE = 32
MAX_MODEL_LEN = 4096


def pins() -> str:
    """The pins of REQUIREMENTS, one a line, as the install stamp records them."""
    lines = (line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines())
    return "\n".join(sorted(line for line in lines if line)) + "\n"


def engine_installed() -> bool:
    try:
        return VLLM.is_file() and INSTALL_STAMP.read_text() == pins()
    except OSError:
        return False


def skip_reason() -> str | None:
    """Why the real engine cannot run here, or None when it can."""
    if not engine_installed():
        return f"vLLM CPU {VLLM_VERSION} is not installed in {VENV}: run `make real-engine`"
    if not checkpoint.built(MODEL):
        return f"the tiny checkpoint is not built in {MODEL}: run `make real-engine`"
    return None


def available() -> bool:
    return skip_reason() is None


@dataclass
class Worker:
    """One `vllm serve` process (the API server; the engine core and its worker are its
    children, in its process group)."""
    index: int
    core: int
    port: int
    events: str | None          # the KV-event PUB endpoint to connect to, when events are on
    replay: str | None          # the replay ROUTER endpoint, when events are on
    log: Path
    proc: subprocess.Popen = field(repr=False)
    ready_s: float | None = None  # seconds from the start to /health answering 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as e:
            return f"(no log at {self.log}: {e})"

    def logged_kv_tokens(self) -> int:
        """The KV pool's size in tokens as vLLM logs it ("KV cache size: 8,192 tokens")."""
        found = re.findall(r"KV cache size: ([\d,]+) tokens", self.log.read_text(errors="replace"))
        if not found:
            raise AssertionError(f"worker {self.index} logged no KV cache size:\n"
                                 f"{self.log_tail()}")
        return int(found[-1].replace(",", ""))

    def processes(self) -> set[int]:
        """The live processes of this worker: its process group and its descendants."""
        return {p for p in _group(self.pid) | _descendants(self.pid) if alive(p)}


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process from /proc, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name, in parentheses, may hold spaces: the fields follow its last ")"
    fields = raw[raw.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _group(pgid: int) -> set[int]:
    return {p for p in _pids() if (s := _stat(p)) and s[2] == pgid}


def _descendants(pid: int) -> set[int]:
    parent = {p: s[1] for p in _pids() if (s := _stat(p))}
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier and p not in out}
        out |= frontier
    return out


def alive(pid: int) -> bool:
    s = _stat(pid)
    return s is not None and s[0] != "Z"     # a zombie has exited: only its parent's wait is due


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open until all are picked)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def _env(core: int, dev_mode: bool) -> dict[str, str]:
    env = dict(os.environ)
    # the engine's venv sees only its own packages; VLLM_CPU_KVCACHE_SPACE would override
    # --kv-cache-memory-bytes
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "VLLM_CPU_KVCACHE_SPACE"):
        env.pop(name, None)
    env.update(
        PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
        # an explicit core: with `auto` vLLM keeps a core of the two for the API server
        VLLM_CPU_OMP_THREADS_BIND=str(core),
    )
    if dev_mode:                           # /reset_prefix_cache is served only in dev mode
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def _command(port: int, kv_tokens: int, block_size: int, events: tuple[str, str] | None,
             extra_args: Sequence[str]) -> list[str]:
    cmd = [str(VLLM), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", SERVED_NAME, "--dtype", "bfloat16",
           "--max-model-len", str(MAX_MODEL_LEN), "--block-size", str(block_size),
           "--enable-prefix-caching",
           "--enable-prompt-tokens-details", "--enforce-eager",
           "--kv-cache-memory-bytes", str(kv_tokens * KV_BYTES_PER_TOKEN)]
    if events is not None:
        pub, replay = events
        # vLLM's publisher binds an ipc:// endpoint (and tcp only with `*`, every interface:
        # it connects to a concrete tcp address); its replay socket binds what it is given
        cmd += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq", "topic": TOPIC,
            "endpoint": pub, "replay_endpoint": replay})]
    return cmd + list(extra_args)


def _stop(workers: Sequence[Worker], grace: float) -> None:
    """SIGTERM to each worker's process group (and to any descendant that left it), SIGKILL to
    what is left of them after `grace` seconds."""
    tracked = {w.pid: w.processes() for w in workers}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for w in workers:
            if not tracked[w.pid]:
                continue                        # all gone: its ids may belong to others now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.pid, sig)
            for pid in tracked[w.pid] - _group(w.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while any(tracked.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
            for w in workers:
                w.proc.poll()                   # reaps the API server once it exits
                tracked[w.pid] = {p for p in tracked[w.pid] | _group(w.pid) if alive(p)}
        if not any(tracked.values()):
            break
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(5)


def _wait_ready(workers: list[Worker], started: float, timeout: float) -> None:
    pending = list(workers)
    with httpx.Client(timeout=2) as client:
        while pending:
            for w in list(pending):
                if w.proc.poll() is not None:
                    raise RuntimeError(f"vLLM worker {w.index} (pid {w.pid}, port {w.port}) "
                                       f"exited with {w.proc.returncode}; its log {w.log}:\n"
                                       f"{w.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{w.url}/health").status_code == 200:
                        w.ready_s = time.monotonic() - started
                        pending.remove(w)
            if pending and time.monotonic() - started > timeout:
                w = pending[0]
                raise TimeoutError(f"vLLM worker {w.index} (pid {w.pid}, port {w.port}) not "
                                   f"ready after {timeout:.0f} s; its log {w.log}:\n"
                                   f"{w.log_tail()}")
            time.sleep(0.25)


@contextlib.contextmanager
def VllmWorkers(n: int, *, kv_tokens: int = 8192, block_size: int = BLOCK_SIZE,
                cpus: Sequence[int] | None = None, events: bool = True,
                extra_args: Sequence[str] = (), log_dir: Path | None = None,
                startup_timeout: float = 240.0, grace: float = 20.0,
                dev_mode: bool = False, events_tcp: bool = False) -> Iterator[list[Worker]]:
    """n `vllm serve` workers of the tiny checkpoint, ready (their /health answers 200), each
    with a KV pool of `kv_tokens` tokens; worker i runs on core cpus[i % len(cpus)] (by
    default the cores this process may use). Started at once; all stopped on the way out.
    `dev_mode`: VLLM_SERVER_DEV_MODE=1, so /reset_prefix_cache is served; `events_tcp`: the
    events on a tcp port of every interface rather than ipc:// (for tcp-only subscribers)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    if block_size <= 0 or block_size % BLOCK_SIZE:
        raise ValueError(f"vLLM on CPU takes block sizes that are multiples of {BLOCK_SIZE}, "
                         f"not {block_size}")
    if kv_tokens <= 0 or kv_tokens % block_size:
        raise ValueError(f"kv_tokens must be a positive multiple of block_size {block_size}, "
                         f"not {kv_tokens}")
    # vLLM holds one block back (its null block) and refuses a pool that cannot hold one
    # request of the model's whole length beside it
    if kv_tokens < MAX_MODEL_LEN + block_size:
        raise ValueError(f"kv_tokens must be at least {MAX_MODEL_LEN + block_size} (a request of "
                         f"{MAX_MODEL_LEN} tokens and vLLM's null block), not {kv_tokens}")
    reason = skip_reason()
    if reason:
        raise RuntimeError(reason)
    cores = list(cpus) if cpus is not None else sorted(os.sched_getaffinity(0))
    if not cores:
        raise ValueError(f"cpus must name at least one core, not {cpus!r}")
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="vllm-workers-"))
    logs.mkdir(parents=True, exist_ok=True)
    ports = _free_ports(3 * n)
    workers: list[Worker] = []
    started = time.monotonic()
    try:
        for i in range(n):
            port, replay, pub = ports[3 * i: 3 * i + 3]
            core = cores[i % len(cores)]
            log = logs / f"vllm-{i}-{port}.log"
            # events_tcp: on tcp://*:PORT (every interface: vLLM binds tcp only on a wildcard),
            # for subscribers that take tcp alone (vllm-router's kv_aware); else ipc://
            bound = f"tcp://*:{pub}" if events_tcp else f"ipc://{logs / f'kv-{i}-{port}.pub'}"
            ends = (bound.replace("*", "127.0.0.1"), f"tcp://127.0.0.1:{replay}")
            cmd = ["taskset", "-c", str(core),
                   *_command(port, kv_tokens, block_size,
                             (bound, ends[1]) if events else None, extra_args)]
            with open(log, "w") as out:
                # a session of its own: its process group is the worker and all it spawns
                proc = subprocess.Popen(cmd, env=_env(core, dev_mode), cwd=ROOT,
                                        stdin=subprocess.DEVNULL,
                                        stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            workers.append(Worker(
                index=i, core=core, port=port, log=log, proc=proc,
                events=ends[0] if events else None, replay=ends[1] if events else None))
        _wait_ready(workers, started, startup_timeout)
        yield workers
    finally:
        _stop(workers, grace)
