"""A load client for any OpenAI-compatible server (radixkv serve, SGLang, vLLM): it replays a
Workload's token-id prompts against POST /v1/completions with streaming and measures every
request (TTFT, inter-token latencies, E2E, prompt, cached and output tokens) and the run.

Each request sends `prompt` as token ids with max_tokens = max(output_len, 1), ignore_eos,
temperature 0, stream with usage. When requests are sent:
- open loop, request_rate None: at the trace's arrival times (relative to the first);
- open loop, request_rate R: the same times scaled so the mean rate is R requests/s (a trace
  whose requests all arrive together is sent at a constant R, in trace order); inf: all at once;
- closed loop, max_concurrency N: N clients, each sending its next request when its previous
  one finishes; a session stays on one client, so a conversation's turns go in order;
- session arrivals (`arrivals`, open loop): each session's first turn (and each request
  without a session) at its time as above (request_rate scales those times alone), each later
  turn its think time after the previous turn's response completed (workloads/sessions.py).
A failed request (HTTP status, timeout, broken stream) is recorded with its error and the run
goes on. `duration_limit` stops the run: requests in flight then are errors, the rest unsent.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import httpx

from radixkv.bench.stats import RequestRecord, summarize
from radixkv.argcheck import positive_int
from radixkv.workloads import TraceRequest, Workload
from radixkv.workloads.sessions import SessionArrivals, SessionChain, SessionQueue

__all__ = ["BenchConfig", "BenchResult", "RequestRecord", "SSEParser", "StreamState",
           "run_benchmark", "send_times", "summarize"]


@dataclass(frozen=True)
class BenchConfig:
    """Where and how to send: base_url (with or without a trailing /v1), the model (None: the
    first that GET /v1/models lists), the send mode, and the time bounds in seconds."""
    base_url: str
    model: str | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None
    timeout: float = 600.0
    duration_limit: float | None = None
    api_key: str | None = None
    text: bool = False          # prompts as text (see as_text), for gateways that route on text
    arrivals: SessionArrivals | None = None     # session arrivals (open loop)

    def __post_init__(self) -> None:
        url = self.base_url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url {self.base_url!r} is not an http:// or https:// URL")
        object.__setattr__(self, "base_url", url.removesuffix("/v1"))
        r = self.request_rate
        if r is not None and not (isinstance(r, (int, float)) and r > 0):   # NaN fails too
            raise ValueError(f"--request-rate {r!r} is not a positive number (or inf)")
        if self.max_concurrency is not None:
            positive_int(self.max_concurrency, "--max-concurrency")
            if r is not None:
                raise ValueError("--request-rate and --max-concurrency are two send modes; "
                                 "give one or the other")
            if self.arrivals is not None:
                raise ValueError("--arrivals session is open loop and --max-concurrency "
                                 "closed loop; give one or the other")
        for name, v in (("--timeout", self.timeout), ("--duration-limit", self.duration_limit)):
            if v is not None and not (isinstance(v, (int, float)) and 0 < v < math.inf):
                raise ValueError(f"{name} {v!r} is not a positive, finite number of seconds")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class BenchResult:
    model: str
    records: list[RequestRecord]
    summary: dict


class SSEParser:
    """Server-sent events, one line at a time: `feed` returns an event's data (its data lines
    joined by newlines) when the blank line that ends it arrives, else None."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):                 # a comment, e.g. a keep-alive
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def flush(self) -> str | None:
        """The pending event's data, if a stream ended without its closing blank line."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


@dataclass
class StreamState:
    """What a completions stream has said so far. A content chunk is a choice with text, or
    one without text that is not the finishing chunk (a token that decodes to no text yet)."""
    start: float
    first: float | None = None
    last: float | None = None
    itls: list[float] = field(default_factory=list)
    chunks: int = 0
    usage: dict | None = None
    done: bool = False
    error: str | None = None

    def on_event(self, data: str, now: float) -> None:
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.error = f"not a JSON chunk: {data[:80]!r}"
            return
        if not isinstance(obj, dict):
            self.error = f"not a JSON object chunk: {data[:80]!r}"
            return
        if obj.get("error"):
            err = obj["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices") or []
        c = choices[0] if isinstance(choices, list) and choices else None
        if isinstance(c, dict) and (c.get("text") or c.get("finish_reason") is None):
            if self.first is None:
                self.first = now
            else:
                self.itls.append(now - self.last)
            self.last = now
            self.chunks += 1

    def record(self, r: TraceRequest, sent: float, end: float) -> RequestRecord:
        u = self.usage or {}
        details = u.get("prompt_tokens_details") or {}
        error = self.error
        if error is None and not self.done:
            error = "the stream ended without data: [DONE]"
        if error is None and self.first is None:
            error = "the stream held no content chunk"
        return RequestRecord(
            r.id, sent, ttft=None if self.first is None else self.first - self.start,
            itls=self.itls, e2e=end - self.start,
            prompt_tokens=_count(u.get("prompt_tokens"), len(r.prompt)),
            cached_tokens=_count(details.get("cached_tokens") if isinstance(details, dict)
                                 else None, 0),
            output_tokens=_count(u.get("completion_tokens"), self.chunks), error=error)


def _count(v: object, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else default


def _one_line(text: str, n: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def send_times(workload: Sequence[TraceRequest], request_rate: float | None) -> list[float]:
    """Seconds after the start at which each request is sent, open loop (see the module)."""
    rel = [r.arrival - workload[0].arrival for r in workload]
    if request_rate is None:
        return rel
    if math.isinf(request_rate):
        return [0.0] * len(rel)
    if rel[-1] == 0:
        return [i / request_rate for i in range(len(rel))]
    factor = (len(rel) - 1) / (rel[-1] * request_rate)   # mean rate (n - 1) / span -> R
    return [t * factor for t in rel]


def as_text(tokens) -> str:
    """A prompt of token ids as printable ASCII, token t as chr(33 + t % 94): equal prompts stay
    equal and a shared prefix stays shared (two different ids meet as one character 1 time in
    94, which can lengthen a shared prefix by that character)."""
    return "".join(chr(33 + int(t) % 94) for t in tokens)


class _Run:
    """One benchmark run's requests, records and clock."""

    def __init__(self, client: httpx.AsyncClient, cfg: BenchConfig, model: str,
                 workload: Workload, progress: Callable[[int], None] | None):
        self.client, self.cfg, self.model, self.workload = client, cfg, model, workload
        self.progress = progress
        self.records: list[RequestRecord | None] = [None] * len(workload)
        self.sent: dict[int, float] = {}
        self.t0 = time.perf_counter()

    async def send(self, i: int) -> None:
        r = self.workload[i]
        start = time.perf_counter()
        self.sent[i] = start - self.t0
        state = StreamState(start)
        payload = {"model": self.model,
                   "prompt": as_text(r.prompt) if self.cfg.text else list(r.prompt),
                   "max_tokens": max(r.output_len, 1), "temperature": 0.0,
                   "ignore_eos": True, "stream": True,
                   "stream_options": {"include_usage": True}}
        try:
            async with asyncio.timeout(self.cfg.timeout):
                async with self.client.stream("POST", "/v1/completions", json=payload,
                                              headers=self.cfg.headers) as resp:
                    if resp.status_code != 200:
                        body = (await resp.aread()).decode("utf-8", "replace")
                        state.error = f"HTTP {resp.status_code}: {_one_line(body)}"
                    else:
                        parser = SSEParser()
                        async for line in resp.aiter_lines():
                            data = parser.feed(line)
                            if data is not None:
                                state.on_event(data, time.perf_counter())
                            if state.done or state.error:
                                break
                        tail = parser.flush()
                        if tail is not None and not (state.done or state.error):
                            state.on_event(tail, time.perf_counter())
        except TimeoutError:
            state.error = f"timed out after {self.cfg.timeout:g} s"
        except Exception as e:          # a failed request is a result, never the run's end
            state.error = _one_line(f"{type(e).__name__}: {e}")
        self.records[i] = state.record(r, self.sent[i], time.perf_counter())
        if self.progress is not None:
            self.progress(1)

    async def open_loop(self, times: list[float]) -> None:
        tasks = []
        try:
            for i, at in enumerate(times):
                delay = self.t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(self.send(i)))
            await asyncio.gather(*tasks)
        finally:                        # stopped early: no request outlives the run
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def sessions(self, arrivals: SessionArrivals) -> None:
        """Session arrivals: each session's first request at its send time, each later turn
        its think time after the previous turn's response completed (failed or not)."""
        chain = SessionChain([r.session for r in self.workload], arrivals)
        times = send_times([self.workload[i] for i in chain.heads], self.cfg.request_rate)

        async def session(i: int | None, at: float) -> None:
            delay = self.t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            while i is not None:
                await self.send(i)
                i = chain.successor[i]
                if i is not None and chain.think[i] > 0:
                    await asyncio.sleep(chain.think[i])

        tasks = [asyncio.create_task(session(i, at)) for i, at in zip(chain.heads, times)]
        try:
            await asyncio.gather(*tasks)
        finally:                        # stopped early: no request outlives the run
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def closed_loop(self, num_clients: int) -> None:
        order = SessionQueue([r.session for r in self.workload], num_clients)

        async def client(c: int) -> None:
            while (i := order.take(c)) is not None:
                await self.send(i)
        await asyncio.gather(*(client(c) for c in range(num_clients)))


async def fetch_model(client: httpx.AsyncClient, cfg: BenchConfig) -> str:
    """The first model GET /v1/models lists."""
    url = f"{cfg.base_url}/v1/models"
    try:
        resp = await client.get("/v1/models", headers=cfg.headers)
    except httpx.HTTPError as e:
        raise ConnectionError(f"cannot reach {url}: {type(e).__name__}: {e}") from None
    if resp.status_code != 200:
        raise ValueError(f"GET {url} answered HTTP {resp.status_code}: {_one_line(resp.text)}; "
                         f"give --model")
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"GET {url} lists no model ({_one_line(resp.text)}); give --model") \
            from None


async def run_benchmark_async(workload: Workload, cfg: BenchConfig,
                              progress: Callable[[int], None] | None = None,
                              transport: httpx.AsyncBaseTransport | None = None) -> BenchResult:
    """run_benchmark in a running event loop; `transport` replaces the network (tests)."""
    if not len(workload):
        raise ValueError(f"workload {workload.name!r} has no requests")
    limits = httpx.Limits(max_connections=cfg.max_concurrency,
                          max_keepalive_connections=cfg.max_concurrency)
    timeout = httpx.Timeout(cfg.timeout)
    async with httpx.AsyncClient(base_url=cfg.base_url, timeout=timeout, limits=limits,
                                 transport=transport) as client:
        model = cfg.model or await fetch_model(client, cfg)
        run = _Run(client, cfg, model, workload, progress)
        if cfg.max_concurrency:
            driver = run.closed_loop(cfg.max_concurrency)
        elif cfg.arrivals is not None:
            driver = run.sessions(cfg.arrivals)
        else:
            driver = run.open_loop(send_times(workload, cfg.request_rate))
        try:
            async with asyncio.timeout(cfg.duration_limit):
                await driver
        except TimeoutError:
            pass
        duration = time.perf_counter() - run.t0
    for i, sent in run.sent.items():
        if run.records[i] is None:
            run.records[i] = RequestRecord(workload[i].id, sent, error="in flight at the "
                                           f"--duration-limit of {cfg.duration_limit:g} s")
    records = [r for r in run.records if r is not None]
    return BenchResult(model, records, summarize(records, duration, len(workload)))


def run_benchmark(workload: Workload, cfg: BenchConfig,
                  progress: Callable[[int], None] | None = None) -> BenchResult:
    """Replay `workload` against the server at cfg.base_url; see the module docstring."""
    return asyncio.run(run_benchmark_async(workload, cfg, progress))
