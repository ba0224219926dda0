"""The gateway's workers: what it learns of each (the model from `/v1/models`; the page or block
size, KV capacity and the hashes its KV events carry from radixkv's `/server_info`, SGLang's
`/get_server_info` or vLLM's `vllm:cache_config_info`), how loaded each is (SGLang's
`/get_load` where the worker serves it, as radixkv's do, else its `/metrics`; read at most
every `scrape_interval` seconds), and whether it is healthy (`/health`, checked every
`health_interval`; `failures_to_leave` failures in a row take it out of the rotation, one
success brings it back). Every request to a worker goes
through one aiohttp session; `WORKER_ERRORS` are what a worker that is down, unreachable or
misnamed raises."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from radixkv.kvevents.vllm_hash import scheme_of
from radixkv.promtext import parse_metrics

log = logging.getLogger(__name__)
WORKER_ERRORS = (aiohttp.ClientError, OSError)   # refused, reset, timed out (an OSError), bad URL

# running requests, waiting requests, KV usage share: vLLM's names, then SGLang's
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
USAGE = ("vllm:kv_cache_usage_perc", "sglang:token_usage")
_WANTED = tuple(f"{n}{c}" for n in RUNNING + WAITING + USAGE for c in ("{", " "))


def load_figures(text: str) -> dict[str, float]:
    """The load samples of a worker's /metrics (parse_metrics over just their lines: a worker's
    exposition is mostly histograms the gateway does not read)."""
    return parse_metrics("\n".join(ln for ln in text.splitlines() if ln.startswith(_WANTED)))


@dataclass
class Worker:
    url: str
    model: str | None = None
    page_size: int | None = None
    capacity: int = 0                         # KV slots (tokens); 0: unknown
    hash_scheme: str | None = None            # its events' page hashes (ROUTE_HASHES); None: unknown
    engine: str | None = None                 # radixkv | sglang | vllm, by what it answered
    healthy: bool = True
    failures: int = 0
    figures: dict = field(default_factory=dict)     # running, waiting, kv_used, kv_capacity
    scraped: float = 0.0
    load_path: str = "/metrics"               # where its load is read (discover: /get_load)

    def describe(self) -> dict:
        return {"url": self.url, "model": self.model, "page_size": self.page_size,
                "engine": self.engine, "kv_hash": self.hash_scheme, "kv_capacity": self.capacity,
                "healthy": self.healthy, "load_from": self.load_path,
                **self.figures}


async def get(session: aiohttp.ClientSession, url: str, timeout: float | None = None
              ) -> tuple[int, bytes]:
    """GET `url`: (status, body); the session's timeouts unless `timeout` (seconds, whole)."""
    kw = {} if timeout is None else {"timeout": aiohttp.ClientTimeout(total=timeout)}
    try:
        async with session.get(url, **kw) as r:
            return r.status, await r.read()
    except aiohttp.InvalidURL:
        raise
    except ValueError as e:                   # the URL does not parse (yarl)
        raise aiohttp.InvalidURL(url, str(e)) from None


async def discover(session: aiohttp.ClientSession, w: Worker) -> None:
    """Fill in what `w` serves: its model, page size, KV capacity and the hashes of its KV
    events (what it does not say stays unknown). A worker that does not answer raises one of
    WORKER_ERRORS; one that answers /v1/models with an error or not in JSON, ValueError."""
    status, body = await get(session, f"{w.url}/v1/models")
    if status != 200:
        raise ValueError(f"{w.url}/v1/models answered HTTP {status}")
    data = json.loads(body).get("data") or []
    w.model = data[0]["id"] if data else None
    try:          # a small JSON answer, where a vLLM worker renders its whole /metrics
        status, body = await get(session, f"{w.url}/get_load")
        w.load_path = "/get_load" if status == 200 and isinstance(json.loads(body), list) \
            else "/metrics"
    except (*WORKER_ERRORS, ValueError):
        w.load_path = "/metrics"
    for path in ("/server_info", "/get_server_info"):
        try:
            status, body = await get(session, f"{w.url}{path}")
        except WORKER_ERRORS:
            continue
        if status == 200:
            info = json.loads(body)
            w.engine = "radixkv" if path == "/server_info" else "sglang"
            w.page_size = info.get("page_size") or w.page_size
            w.capacity = info.get("kv_capacity") or info.get("max_total_num_tokens") or w.capacity
            w.hash_scheme = info.get("kv_hash") or w.hash_scheme       # radixkv's own
            if w.page_size:
                return
    try:                                       # vLLM: the cache's configuration in /metrics
        _, body = await get(session, f"{w.url}/metrics")
        for fam in text_string_to_metric_families(body.decode()):
            if fam.name == "vllm:cache_config_info":
                labels = fam.samples[0].labels
                w.engine = "vllm"
                w.page_size = int(labels["block_size"])
                w.capacity = int(labels["num_gpu_blocks"]) * w.page_size
                w.hash_scheme = scheme_of(labels.get("prefix_caching_hash_algo", ""))
    except (*WORKER_ERRORS, ValueError, KeyError, IndexError):
        pass


def _first(values: dict, names: tuple) -> float | None:
    return next((values[n] for n in names if n in values), None)


async def scrape(session: aiohttp.ClientSession, w: Worker, interval: float) -> None:
    """Refresh `w.figures` from its load path (/get_load or /metrics), at most every
    `interval` seconds; an answer that does not read leaves them as they were."""
    now = time.monotonic()
    if now - w.scraped < interval:
        return
    w.scraped = now
    try:
        status, body = await get(session, f"{w.url}{w.load_path}")
        if status != 200:
            return
        running, waiting, used = (sglang_load(json.loads(body)) if w.load_path == "/get_load"
                                  else metrics_load(body.decode(), w.capacity))
    except (*WORKER_ERRORS, ValueError, TypeError, KeyError):
        return
    w.figures = {"running": running, "waiting": waiting, "kv_capacity": w.capacity,
                 "kv_used": used}


def metrics_load(text: str, capacity: int) -> tuple[int, int, int]:
    """(running, waiting, KV tokens in use) from a vLLM or SGLang /metrics exposition."""
    values = load_figures(text)
    running, usage = _first(values, RUNNING), _first(values, USAGE)
    return int(running or 0), int(_first(values, WAITING) or 0), int((usage or 0.0) * capacity)


def sglang_load(ranks: list) -> tuple[int, int, int]:
    """(running, waiting, KV tokens in use) from SGLang's /get_load: one entry per data-parallel
    rank, summed; its num_reqs counts the waiting requests too."""
    reqs = sum(int(r["num_reqs"]) for r in ranks)
    waiting = sum(int(r["num_waiting_reqs"]) for r in ranks)
    return reqs - waiting, waiting, sum(int(r.get("num_tokens", 0)) for r in ranks)


async def check_health(session: aiohttp.ClientSession, w: Worker, failures_to_leave: int
                       ) -> bool | None:
    """Probe `w`; True when it just left the rotation, False when it just came back, else None."""
    try:
        ok = (await get(session, f"{w.url}/health", timeout=5.0))[0] == 200
    except WORKER_ERRORS:
        ok = False
    if ok:
        w.failures = 0
        if not w.healthy:
            w.healthy = True
            return False
        return None
    w.failures += 1
    if w.healthy and w.failures >= failures_to_leave:
        w.healthy = False
        return True
    return None


async def every(seconds: float, fn) -> None:
    """Run `fn()` every `seconds` until cancelled; an error is logged, not fatal."""
    while True:
        try:
            await fn()
        except Exception:                       # a probe must never end the loop
            log.exception("gateway background task failed")
        await asyncio.sleep(seconds)
