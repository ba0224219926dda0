"""The HTTP routes: the OpenAI API as vLLM and SGLang serve it, plus /health, /server_info,
/metrics and /flush_cache; vLLM's and SGLang's own endpoints come from server/vllm_api.py and
server/sglang_api.py.

A request is checked completely (server/state.py) before it reaches the engine thread, so bad
input gets a 4xx with an OpenAI-style error body and changes nothing. A client that goes away
aborts its request: the engine thread releases its lock and slots before its next step.
"""
from __future__ import annotations

import asyncio
import json
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from radixkv.sched.request import Request
from radixkv.server import protocol as P
from radixkv.server.sglang_api import add_sglang_routes, sglang_keys
from radixkv.server.guard import RID_KEY, RequestGuard
from radixkv.server.state import (APIError, ServerState, checked_request, engine_down,
                                  error_event, error_message, error_response, on_engine,
                                  reset_cache, tenant_of)
from radixkv.server.text import Detokenizer
from radixkv.server.updates import ClosingStreamingResponse, UpdateQueue
from radixkv.server.vllm_api import add_vllm_routes
from radixkv.server.worker import engine_stats


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
    app.add_middleware(RequestGuard, max_bytes=state.max_request_bytes,
                       timeout=state.client_timeout)

    # ---- errors: OpenAI-style bodies, 4xx for anything a client sent --------------------------
    @app.exception_handler(APIError)
    async def _api_error(_, e: APIError):
        return error_response(e.status, e.message, e.kind, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        msg = str(first.get("msg", "invalid request"))
        return error_response(400, f"{where}: {msg}" if where else msg, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(e.status_code, str(e.detail), kind)

    # ---- the OpenAI API -----------------------------------------------------------------------
    @app.get("/v1/models")
    async def models(raw: HTTPRequest):
        tenant_of(state, raw)
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
        down = engine_down(state)
        if down is not None:
            return error_response(down.status, down.message, down.kind)
        return Response(status_code=200)

    @app.get("/server_info")
    async def server_info():
        live = await on_engine(state, engine_stats)
        return {**state.info, **sglang_keys(state), "live": live}

    @app.get("/metrics")
    async def metrics():
        if state.metrics is None:
            return error_response(404, "metrics are off: start the server with --enable-metrics",
                          "not_found_error")
        return Response(state.metrics.render(),
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/flush_cache")
    async def flush_cache(raw: HTTPRequest):
        await reset_cache(state, raw, "flush the cache")
        return {"message": "cache flushed"}

    add_vllm_routes(app, state)
    add_sglang_routes(app, state)
    return app


async def _generate(state: ServerState, raw: HTTPRequest, body, chat: bool):
    req = await checked_request(state, raw, body, chat)
    raw.scope.setdefault("state", {})[RID_KEY] = req.rid     # what guard.py's warnings name
    down = engine_down(state)
    if down is not None:
        raise down
    q = UpdateQueue(state.worker, req, asyncio.get_running_loop())
    state.worker.submit(req, q.deliver)
    created, detok = int(time.time()), Detokenizer(state.tokenizer)
    if body.stream:
        usage = body.stream_options is not None and body.stream_options.include_usage
        return ClosingStreamingResponse(_stream(state, req, q, detok, chat, created, usage,
                                                body.return_cached_tokens_details),
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
                    raise APIError(500, error_message(state, u), "server_error")
                out = P.completion_body(req.rid, state.model_name, "".join(text),
                                        u.finish_reason, P.usage(*u.usage), chat=chat,
                                        created=created)
                if body.return_cached_tokens_details:
                    out["sglext"] = P.sglext(u.usage[2], req.host_hit_tokens)
                return out
    finally:
        if not finished:
            state.worker.abort(req)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


async def _stream(state: ServerState, req: Request, q: UpdateQueue, detok: Detokenizer,
                  chat: bool, created: int, include_usage: bool, details: bool):
    finished, name = False, state.model_name
    try:
        if chat:
            yield _sse(P.completion_chunk(req.rid, name, "", None, chat=True, created=created,
                                          role=True))
        while True:
            u = await q.get()
            if u.finish_reason == "error":      # the engine failed: an error event, then [DONE]
                finished = True
                yield error_event(state, u)
                yield "data: [DONE]\n\n"
                return
            end = u.finish_reason is not None
            text = detok.push(u.tokens, final=end)
            if text or end:
                chunk = P.completion_chunk(req.rid, name, text, u.finish_reason, chat=chat,
                                           created=created)
                if end and details:          # SGLang puts the details on the last chunks
                    chunk["sglext"] = P.sglext(u.usage[2], req.host_hit_tokens)
                yield _sse(chunk)
            if end:
                finished = True
                if include_usage:
                    chunk = P.usage_chunk(req.rid, name, P.usage(*u.usage), chat=chat,
                                          created=created)
                    if details:
                        chunk["sglext"] = P.sglext(u.usage[2], req.host_hit_tokens)
                    yield _sse(chunk)
                yield "data: [DONE]\n\n"
                return
    finally:
        if not finished:                # the client went away (the stream was cancelled)
            state.worker.abort(req)
