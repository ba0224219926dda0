"""`radixkv serve` as a user runs it: a subprocess on a free port that answers the openai
client, reports cached tokens on a repeated chat, and stops on SIGTERM; bad flags are one-line
errors before anything binds."""
from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from tests.server._helpers import client


def start(*flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "radixkv", "serve", "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise AssertionError(f"no listening line: {line!r} {proc.stderr.read()}")
    return proc, line.split("listening on ")[1].split()[0]


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_tiny_llama_answers_openai_and_caches_the_repeat():
    proc, url = start("--model", "tiny-llama", "--enable-metrics")
    try:
        c = client(url)
        msgs = [{"role": "system", "content": "You answer briefly."},
                {"role": "user", "content": "What is a radix tree?"}]
        r1 = c.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=4)
        r2 = c.chat.completions.create(model="tiny-llama", messages=msgs, max_tokens=4)
        assert r1.usage.prompt_tokens_details.cached_tokens == 0
        assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1 > 0
        info = httpx.get(f"{url}/server_info").json()
        assert info["flags"]["--page-size"] == {"value": 1, "default": 1, "source": "default"}
        assert info["executor"].startswith("torch:tiny-llama")
    finally:
        assert stop(proc) == 0


def test_serve_flags_are_reported_with_their_source():
    proc, url = start("--executor", "sim", "--model", "llama-3-8b", "--schedule-policy", "lpm",
                      "--page-size", "16", "--max-total-tokens", "50000")
    try:
        info = httpx.get(f"{url}/server_info").json()
        flags = info["flags"]
        assert flags["--schedule-policy"] == {"value": "lpm", "default": "fcfs", "source": "flag"}
        assert flags["--page-size"]["value"] == 16 and flags["--page-size"]["source"] == "flag"
        assert flags["--radix-eviction-policy"]["source"] == "default"
        assert info["kv_capacity"] == 50000 and info["cache"] == "radix p16 lru"
    finally:
        assert stop(proc) == 0


@pytest.mark.parametrize("flags,needle", [
    (["--executor", "sim", "--model", "tiny-llama"], "simulated model"),
    (["--kv-events-config", "{bad"], "kv-events-config"),
    (["--api-keys", "/nonexistent/keys.json"], "does not exist"),
    (["--port", "70000"], "--port"),
    (["--max-total-tokens", "0"], "--max-total-tokens"),
])
def test_bad_flags_are_one_line_errors(flags, needle):
    r = subprocess.run([sys.executable, "-m", "radixkv", "serve", "--port", "0", *flags],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("radixkv serve: error:") and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
