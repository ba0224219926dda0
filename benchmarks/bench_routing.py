"""What one routing decision costs the gateway's loop: `Routing.place` (choose a worker, predict
its hit, record the request as sent), then the first token and the finish, per request, for
each event-fed router over four workers fed their KV events, on prompts that are fresh (nothing
held anywhere) and prompts behind a 2,500-token preamble a worker holds, at page size 1 (SGLang's)
and 16 (vLLM's). Each figure beside the same router hashing every prompt whole before routing
(the baseline, measured in the same process, interleaved): the ratio is what hashing only as far
as the match reads (kvevents/hashes.py) saves.

    python benchmarks/bench_routing.py [--requests 300] [--repeats 3] [--tokens 4000]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from radixkv.cache.events import KVEvent  # noqa: E402
from radixkv.gateway.core import EventSource, Routing  # noqa: E402
from radixkv.gateway.workers import Worker  # noqa: E402
from radixkv.kvevents.hashes import page_hashes  # noqa: E402
from radixkv.kvevents.wire import KVEventBatch, to_wire  # noqa: E402
from radixkv.router import RequestInfo  # noqa: E402
from radixkv.sim.measured import named_cost  # noqa: E402

ROUTERS = ("radixkv-fit", "radixkv", "llm-d-precise", "dynamo-kv")
WORKERS = 4


def build(router: str, page_size: int, preamble: list[int]) -> Routing:
    urls = [f"http://w{i}" for i in range(WORKERS)]      # their feeds subscribe to a silent
    r = Routing(router, events={u: EventSource("tcp://127.0.0.1:9") for u in urls},  # port
                cost=named_cost("llama-3-8b", "h100-sxm"))
    r.build([Worker(u, page_size=page_size, capacity=400_000) for u in urls])
    hashes = page_hashes(preamble, (None, None), page_size)
    events = [KVEvent("stored", h, p, tuple(preamble[i * page_size:(i + 1) * page_size]))
              for i, (h, p) in enumerate(zip(hashes, [None, *hashes]))]
    r.on_events(0, KVEventBatch(0.0, to_wire(events, page_size)))   # as a feed hands it
    return r


def per_request(routing: Routing, prompts: list[list[int]], whole: bool) -> float:
    """ms per request: place, first token, finish; `whole`: the prompt hashed whole first."""
    infos = [RequestInfo(f"q{i}", p, arrival=time.monotonic(),
                         max_new_tokens=100) for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    for info in infos:
        if whole:
            routing.router.page_hashes(info).all()
        routing.place(info)
        routing.first_output(info.rid, time.monotonic())
        routing.finished(info.rid)
    return (time.perf_counter() - t0) / len(infos) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=4000, help="prompt length")
    args = ap.parse_args()
    rng = random.Random(0)
    preamble = [rng.randrange(32000) for _ in range(2500)]
    table = Table(title=f"one routing decision, ms per request ({args.tokens:,}-token prompts, "
                        f"{WORKERS} workers; median of {args.repeats})")
    for col in ("router", "page size", "prompts", "hashed whole", "as far as read", "ratio"):
        table.add_column(col, justify="left" if col in ("router", "prompts") else "right")
    for router in ROUTERS:
        for ps in (1, 16):
            for kind in ("fresh", "behind a held preamble"):
                lazy, whole = [], []
                for _ in range(args.repeats):         # interleaved: the machine's drift is shared
                    for is_whole, out in ((True, whole), (False, lazy)):
                        routing = build(router, ps, preamble)
                        head = preamble if kind != "fresh" else []
                        prompts = [head + [rng.randrange(32000) for _ in range(args.tokens - len(head))]
                                   for _ in range(args.requests)]
                        out.append(per_request(routing, prompts, is_whole))
                        routing.close()
                w, lz = statistics.median(whole), statistics.median(lazy)
                table.add_row(router, str(ps), kind, f"{w:.3f}", f"{lz:.3f}", f"{w / lz:.1f}×")
    Console(width=140).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
