"""What each gateway's process spends to relay a streamed token: one `radixkv serve --executor sim`
worker, the same streaming load (N requests of T tokens each, C at a time, every event one SSE
chunk) straight to the worker and through each gateway in turn — radixkv route (tokenizing
locally with the worker's tokenizer, as the peers route on text without asking the worker),
sglang-router and vllm-router, all round-robin over the one worker, so only the relay differs — and the
gateway's CPU seconds (its whole process session) per chunk, as a ratio to sglang-router's
measured in the same run; with TTFT p50 / p99 at the client. The peers come from `make
interop`'s venvs (skipped, saying so, when absent).

    python benchmarks/bench_relay.py [--requests 200] [--tokens 128] [--concurrency 16]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_gateways import session_cpu, worker_tokenizer  # noqa: E402
from radixkv.bench.process import ServerProcess  # noqa: E402
from tests.interop.conftest import free_port, running  # noqa: E402
from tests.interop.peers import installed, program  # noqa: E402

MODEL = "llama-3-8b"


async def load(base: str, n: int, tokens: int, concurrency: int) -> tuple[int, list[float]]:
    """n streams of `tokens` tokens, `concurrency` at a time: (chunks read, TTFTs)."""
    sem, chunks, ttfts = asyncio.Semaphore(concurrency), 0, []
    async with httpx.AsyncClient(base_url=base, timeout=120) as c:
        async def one(i: int) -> None:
            nonlocal chunks
            async with sem:
                t0, first = time.perf_counter(), True
                async with c.stream("POST", "/v1/completions", json={
                        "model": MODEL, "prompt": f"request {i} " * 50, "max_tokens": tokens,
                        "ignore_eos": True, "stream": True}) as r:
                    r.raise_for_status()
                    async for line in r.aiter_lines():
                        if line.startswith("data:"):
                            chunks += 1
                            if first:
                                ttfts.append(time.perf_counter() - t0)
                                first = False
        await asyncio.gather(*(one(i) for i in range(n)))
    return chunks, sorted(ttfts)


def gateways(worker: str, port: int, tokenizer: str) -> dict[str, list[str] | None]:
    out: dict[str, list[str] | None] = {
        "radixkv route": [sys.executable, "-m", "radixkv", "route", "--worker-urls", worker,
                          "--host", "127.0.0.1", "--port", str(port), "--router", "round-robin",
                          "--tokenizer", tokenizer]}
    for name, tool, sub in (("sglang-router", "sglang-router", ["launch"]),
                            ("vllm-router", "vllm-router", [])):
        out[name] = [str(program(tool)), *sub, "--host", "127.0.0.1", "--port", str(port),
                     "--prometheus-port", str(free_port()), "--worker-urls", worker, "--policy",
                     "round_robin"] if installed(tool) else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    con, rows = Console(width=160), []
    run = lambda base: asyncio.run(load(base, args.requests, args.tokens, args.concurrency))  # noqa: E731
    flags = ["--executor", "sim", "--model", MODEL, "--max-total-tokens", "200000"]
    with contextlib.ExitStack() as st:
        tok = worker_tokenizer(st)
        worker = st.enter_context(ServerProcess(flags)).base_url
        run(worker)                                               # warm-up
        chunks, ttfts = run(worker)
        rows.append(("direct", chunks, None, ttfts))
        for name, cmd in gateways(worker, free_port(), tok).items():
            if cmd is None:
                con.print(f"[yellow]{name}: not installed (make interop): skipped")
                continue
            port = cmd[cmd.index("--port") + 1]
            with running(cmd, f"http://127.0.0.1:{port}/health",
                         Path("/tmp") / f"relay-{port}.log") as proc:
                time.sleep(1.0)
                cpu0 = session_cpu(proc.pid)
                chunks, ttfts = run(f"http://127.0.0.1:{port}")
                rows.append((name, chunks, session_cpu(proc.pid) - cpu0, ttfts))
    peer = next((r[2] / r[1] for r in rows if r[0] == "sglang-router"), None)
    table = Table(title=f"relaying {args.requests} streams of {args.tokens} tokens, "
                        f"{args.concurrency} at a time, through each gateway to one sim worker")
    for col in ("path", "chunks", "gateway CPU", "µs per chunk", "÷ sglang-router",
                "TTFT p50", "TTFT p99"):
        table.add_column(col, justify="left" if col == "path" else "right")
    for name, chunks, cpu, ttfts in rows:
        per = None if cpu is None else cpu / chunks
        table.add_row(name, str(chunks), "-" if cpu is None else f"{cpu:.2f} s",
                      "-" if per is None else f"{per * 1e6:.0f}",
                      "-" if per is None or peer is None else f"{per / peer:.2f}",
                      f"{ttfts[len(ttfts) // 2] * 1e3:.1f} ms",
                      f"{ttfts[int(len(ttfts) * 0.99)] * 1e3:.1f} ms")
    con.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
