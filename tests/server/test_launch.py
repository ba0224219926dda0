"""server/launch.py: what a server process settles before its first request."""
from __future__ import annotations

import subprocess
import sys
import textwrap

# run in a child: freezing the heap of the test process would leave its garbage uncollected
_STARTUP = textwrap.dedent("""
    import asyncio, gc, socket, sys
    from fastapi import FastAPI
    from radixkv.server.launch import _server

    async def main(freeze):
        sock = socket.socket(); sock.bind(("127.0.0.1", 0))
        server = _server(FastAPI(), "warning", freeze_heap=freeze)
        before = "anyio._backends._asyncio" in sys.modules
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.ready:          # `started` is set before the warm-up and the freeze
            await asyncio.sleep(0.01)
        frozen = gc.get_freeze_count()
        server.should_exit = True
        await task
        print(before, "anyio._backends._asyncio" in sys.modules, frozen > 1000, frozen)

    asyncio.run(main(sys.argv[1] == "1"))
""")


def _startup(freeze: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _STARTUP, "1" if freeze else "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_server_process_freezes_its_startup_heap_and_warms_the_task_group_backend():
    # regression: full collections scanned the ~100k startup objects (a ~26 ms stop of the
    # event loop every few hundred requests), and the first streamed response imported
    # anyio's asyncio backend (~23 ms on the first client's TTFT)
    # (regression, a flake under load: the test read the freeze count once `started` was set,
    # before startup had warmed the backend and frozen the heap; it now waits for `ready`)
    before, warmed, frozen, _ = _startup(True)
    assert (before, warmed, frozen) == ("False", "True", "True")


def test_an_in_process_server_leaves_the_heap_alone():
    before, warmed, frozen, count = _startup(False)
    assert (before, warmed, frozen, count) == ("False", "True", "False", "0")


def test_freeze_startup_heap_returns_the_count_it_froze():
    code = ("import gc; from radixkv.server.launch import freeze_startup_heap as f; "
            "n = f(); print(n == gc.get_freeze_count() and n > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True", out.stderr
