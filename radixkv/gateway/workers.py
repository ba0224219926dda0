"""The gateway's workers: what it learns of each (the model from `/v1/models`; the page or block
size and KV capacity from radixkv's `/server_info`, SGLang's `/get_server_info` or vLLM's
`vllm:cache_config_info`), how loaded each is (the worker's `/metrics`, scraped at most every
`scrape_interval` seconds), and whether it is healthy (`/health`, checked every
`health_interval`; `failures_to_leave` failures in a row take it out of the rotation, one success
brings it back)."""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from radixkv.bench.process import parse_metrics

log = logging.getLogger(__name__)

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
    healthy: bool = True
    failures: int = 0
    figures: dict = field(default_factory=dict)     # running, waiting, kv_used, kv_capacity
    scraped: float = 0.0

    def describe(self) -> dict:
        return {"url": self.url, "model": self.model, "page_size": self.page_size,
                "kv_capacity": self.capacity, "healthy": self.healthy, **self.figures}


async def discover(client: httpx.AsyncClient, w: Worker) -> None:
    """Fill in what `w` serves: its model, page size and KV capacity (what it does not say
    stays unknown)."""
    r = await client.get(f"{w.url}/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    w.model = data[0]["id"] if data else None
    for path in ("/server_info", "/get_server_info"):
        try:
            r = await client.get(f"{w.url}{path}")
        except httpx.HTTPError:
            continue
        if r.status_code == 200:
            info = r.json()
            w.page_size = info.get("page_size") or w.page_size
            w.capacity = info.get("kv_capacity") or info.get("max_total_num_tokens") or w.capacity
            if w.page_size:
                return
    try:                                       # vLLM: the cache's configuration in /metrics
        text = (await client.get(f"{w.url}/metrics")).text
        for fam in text_string_to_metric_families(text):
            if fam.name == "vllm:cache_config_info":
                labels = fam.samples[0].labels
                w.page_size = int(labels["block_size"])
                w.capacity = int(labels["num_gpu_blocks"]) * w.page_size
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        pass


def _first(values: dict, names: tuple) -> float | None:
    return next((values[n] for n in names if n in values), None)


async def scrape(client: httpx.AsyncClient, w: Worker, interval: float) -> None:
    """Refresh `w.figures` from its /metrics, at most every `interval` seconds."""
    now = time.monotonic()
    if now - w.scraped < interval:
        return
    w.scraped = now
    try:
        r = await client.get(f"{w.url}/metrics")
        if r.status_code != 200:
            return
        values = load_figures(r.text)
    except (httpx.HTTPError, ValueError):
        return
    running, usage = _first(values, RUNNING), _first(values, USAGE)
    w.figures = {"running": int(running or 0), "waiting": int(_first(values, WAITING) or 0),
                 "kv_capacity": w.capacity,
                 "kv_used": int((usage or 0.0) * w.capacity)}


async def check_health(client: httpx.AsyncClient, w: Worker, failures_to_leave: int) -> bool | None:
    """Probe `w`; True when it just left the rotation, False when it just came back, else None."""
    try:
        ok = (await client.get(f"{w.url}/health", timeout=5.0)).status_code == 200
    except httpx.HTTPError:
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
