"""The HTTP routes: the OpenAI API as vLLM and SGLang serve it, plus /health, /server_info,
/metrics and /flush_cache.

A request is checked completely here — auth, model, fields, token ids, context, pool — before
it reaches the engine thread, so bad input gets a 4xx with an OpenAI-style error body and
changes nothing. A client that goes away aborts its request: the engine thread releases its
lock and slots before its next step.
"""
from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixkv.sched.request import Request
from radixkv.server import protocol as P
from radixkv.server.tenants import AuthError, Tenants
from radixkv.server.text import ChatTemplate, Detokenizer
from radixkv.server.worker import EngineWorker, Update, engine_stats


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


@dataclass
class ServerState:
    worker: EngineWorker
    tokenizer: Any
    template: ChatTemplate
    model_name: str
    max_model_len: int
    vocab_size: int
    eos_id: int | None
    tenants: Tenants = field(default_factory=Tenants)
    allow_client_cache_salt: bool = False
    metrics: Any = None                      # ServerMetrics, or None: /metrics is off
    info: dict = field(default_factory=dict)   # the resolved configuration
    make_sampling: Callable[[P.SamplingFields, int], Any] | None = None   # torch executor only
    on_ready: Callable[[], Any] | None = None
    closers: list[Callable[[], Any]] = field(default_factory=list)   # run at shutdown


def _error(status: int, message: str, kind: str = "invalid_request_error",
           param: str | None = None) -> JSONResponse:
    return JSONResponse(P.error_body(message, kind, param, status), status_code=status)


def build_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.worker.start()
        if state.on_ready is not None:
            state.on_ready()
        try:
            yield
        finally:
            state.worker.stop()
            for close in state.closers:
                close()

    app = FastAPI(title="radixkv", lifespan=lifespan)
    app.state.radixkv = state

    # ---- errors: OpenAI-style bodies, 4xx for anything a client sent --------------------------
    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return _error(e.status, e.message, e.kind, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = str(first.get("msg", "invalid request"))
        return _error(400, f"{where}: {msg}" if where else msg, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(e.status_code, str(e.detail), kind)

    # ---- the OpenAI API -----------------------------------------------------------------------
    @app.get("/v1/models")
    async def models(raw: HTTPRequest):
        _tenant(state, raw)
        return P.model_list(state.model_name, state.max_model_len)

    @app.post("/v1/completions")
    async def completions(body: P.CompletionRequest, raw: HTTPRequest):
        return await _generate(state, raw, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: P.ChatCompletionRequest, raw: HTTPRequest):
        return await _generate(state, raw, body, chat=True)

    # ---- operations ---------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        if not state.worker.alive():
            return _error(503, state.worker.error or "the engine is not running", "server_error")
        return Response(status_code=200)

    @app.get("/server_info")
    async def server_info():
        live = await asyncio.wrap_future(state.worker.call(engine_stats))
        return {**state.info, "live": live}

    @app.get("/metrics")
    async def metrics():
        if state.metrics is None:
            return _error(404, "metrics are off: start the server with --enable-metrics",
                          "not_found_error")
        return Response(state.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/flush_cache")
    async def flush_cache(raw: HTTPRequest):
        try:
            state.tenants.check_admin(raw.headers.get("authorization"))
        except AuthError as e:
            return _error(403, str(e), "permission_error")
        ok = await asyncio.wrap_future(state.worker.call(_flush))
        if not ok:
            return _error(400, "cannot flush the cache while requests are running or waiting")
        return {"message": "cache flushed"}

    return app


def _flush(eng) -> bool:
    if eng.has_work():
        return False
    eng.manager.reset()
    return True


def _tenant(state: ServerState, raw: HTTPRequest) -> str | None:
    try:
        return state.tenants.tenant_of(raw.headers.get("authorization"))
    except AuthError as e:
        raise APIError(401, str(e), "authentication_error") from None


def prompt_ids(state: ServerState, body, chat: bool) -> list[int]:
    """The prompt's token ids (the chat template applied), checked against the vocabulary."""
    if chat:
        try:
            return state.template.encode([(m.role, m.text()) for m in body.messages])
        except ValueError as e:                  # the checkpoint's template refused them
            raise APIError(400, str(e), param="messages") from None
    if isinstance(body.prompt, str):
        return state.tokenizer.encode(body.prompt, add_bos=state.tokenizer.bos_id is not None)
    bad = next((t for t in body.prompt if not 0 <= t < state.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"prompt token id {bad} is outside the vocabulary "
                            f"[0, {state.vocab_size})", param="prompt")
    return list(body.prompt)


def _make_request(state: ServerState, raw: HTTPRequest, body, chat: bool) -> Request:
    tenant = _tenant(state, raw)
    if body.model is not None and body.model != state.model_name:
        raise APIError(404, f"The model `{body.model}` does not exist; this server serves "
                            f"`{state.model_name}`", "not_found_error", "model")
    msg = body.unsupported()
    if msg:
        raise APIError(400, msg)
    ids = prompt_ids(state, body, chat)
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    limit = body.limit()
    max_tokens = limit or body.default_max_tokens
    if limit is None:                               # a default never overruns the context
        max_tokens = max(min(max_tokens, state.max_model_len - len(ids)), 1)
    if len(ids) + max_tokens > state.max_model_len:
        raise APIError(400, f"This model's maximum context length is {state.max_model_len} "
                            f"tokens. However, you requested {len(ids) + max_tokens} tokens "
                            f"({len(ids)} in the prompt, {max_tokens} for the completion).",
                       param="max_tokens")
    bad_stop = next((t for t in body.stop_token_ids if t >= state.vocab_size), None)
    if bad_stop is not None:
        raise APIError(400, f"stop token id {bad_stop} is outside the vocabulary "
                            f"[0, {state.vocab_size})", param="stop_token_ids")
    try:
        salt = state.tenants.cache_salt(tenant, body.cache_scope, body.cache_salt,
                                        state.allow_client_cache_salt)
        sampling = state.make_sampling(body, max_tokens) if state.make_sampling else None
    except ValueError as e:
        raise APIError(400, str(e)) from None
    stops = list(body.stop_token_ids)
    if not body.ignore_eos and state.eos_id is not None:
        stops.append(state.eos_id)
    # a chat's turn is the replies it already holds (the reuse eviction order learns from it)
    turn = sum(m.role == "assistant" for m in body.messages) if chat else None
    req = Request(P.new_id("chatcmpl" if chat else "cmpl"), ids, max_tokens, cache_salt=salt,
                  sampling=sampling, stop_ids=stops, turn=turn)
    try:
        state.worker.engine.check_fits(req)
    except ValueError as e:
        raise APIError(400, str(e), param="max_tokens") from None
    return req


async def _generate(state: ServerState, raw: HTTPRequest, body, chat: bool):
    req = _make_request(state, raw, body, chat)
    if not state.worker.alive():
        raise APIError(503, state.worker.error or "the engine is not running", "server_error")
    q: asyncio.Queue[Update] = asyncio.Queue()
    state.worker.submit(req, deliver_to(asyncio.get_running_loop(), q))
    created, detok = int(time.time()), Detokenizer(state.tokenizer)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_stream(state, req, q, detok, chat, created, usage),
                                 media_type="text/event-stream")
    finished, text = False, []
    try:
        while True:
            try:
                u = await asyncio.wait_for(q.get(), 0.25)
            except asyncio.TimeoutError:
                if await raw.is_disconnected():
                    return Response(status_code=499)
                continue
            text.append(detok.push(u.tokens, final=u.finish_reason is not None))
            if u.finish_reason is not None:
                finished = True
                if u.finish_reason == "error":
                    raise APIError(500, state.worker.error or "the engine failed", "server_error")
                return P.completion_body(req.rid, state.model_name, "".join(text),
                                         u.finish_reason, P.usage(*u.usage), chat=chat,
                                         created=created)
    finally:
        if not finished:
            state.worker.abort(req)


def deliver_to(loop: asyncio.AbstractEventLoop, q: asyncio.Queue) -> Callable[[Update], None]:
    """The engine thread's way into this event loop. Once the loop is closed (the server is
    shutting down) nobody is listening: the update is dropped, and the engine thread, which
    calls this, must not fail for it."""
    def deliver(u: Update) -> None:
        try:
            loop.call_soon_threadsafe(q.put_nowait, u)
        except RuntimeError:
            pass
    return deliver


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(state: ServerState, req: Request, q: asyncio.Queue, detok: Detokenizer,
                  chat: bool, created: int, include_usage: bool):
    finished, name = False, state.model_name
    try:
        if chat:
            yield _sse(P.completion_chunk(req.rid, name, "", None, chat=True, created=created,
                                          role=True))
        while True:
            u = await q.get()
            end = u.finish_reason is not None
            text = detok.push(u.tokens, final=end)
            if text or end:
                yield _sse(P.completion_chunk(req.rid, name, text, u.finish_reason, chat=chat,
                                              created=created))
            if end:
                finished = True
                if include_usage:
                    yield _sse(P.usage_chunk(req.rid, name, P.usage(*u.usage), chat=chat,
                                             created=created))
                yield "data: [DONE]\n\n"
                return
    finally:
        if not finished:                # the client went away (the stream was cancelled)
            state.worker.abort(req)
