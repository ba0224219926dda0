"""What every route of the server shares: its state (`ServerState`), the error a route raises
(`APIError`, answered with an OpenAI-style body), the cache flush, and the checks that turn a
request body into an engine `Request` — auth, model, fields, token ids, context, pool — before
anything reaches the engine thread, so bad input gets a 4xx and changes nothing."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from radixkv.sched.request import Request
from radixkv.server import protocol as P
from radixkv.server.guard import DEFAULT_CLIENT_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from radixkv.server.tenants import AuthError, Tenants
from radixkv.server.text import ChatTemplate
from radixkv.server.worker import EngineWorker, Update


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
    client_timeout: float = DEFAULT_CLIENT_TIMEOUT      # s: headers, body, response writes
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # a larger body is answered 413 unread


def error_response(status: int, message: str, kind: str = "invalid_request_error",
           param: str | None = None) -> JSONResponse:
    return JSONResponse(P.error_body(message, kind, param, status), status_code=status)


def engine_down(state: ServerState) -> APIError | None:
    """503 naming why, when the engine thread has failed or stopped; else None."""
    if state.worker.alive():
        return None
    return APIError(503, state.worker.error or "the engine is not running", "server_error")


async def on_engine(state: ServerState, fn: Callable[[Any], Any]) -> Any:
    """fn(engine) between steps; a 503 naming why when the engine is down."""
    try:
        return await asyncio.wrap_future(state.worker.call(fn))
    except RuntimeError:
        down = engine_down(state)
        if down is None:
            raise                                # fn's own error
        raise down from None


def error_message(state: ServerState, u: Update) -> str:
    """Why a request ended with "error": its own reason, else the engine's failure."""
    return u.message or state.worker.error or "the engine failed"


def error_event(state: ServerState, u: Update) -> str:
    """The SSE event a stream ends with (before [DONE]) when it ended with "error"."""
    body = P.error_body(error_message(state, u), "server_error", code=500)
    return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"


def flush(eng) -> bool:
    if eng.has_work():
        return False
    eng.manager.reset()
    return True


async def reset_cache(state: ServerState, raw: HTTPRequest, what: str) -> None:
    """Drop the prefix cache between steps, counted; the operator's key is needed with tenants
    (403), and nothing may run or wait (400: "cannot {what} while ...")."""
    try:
        state.tenants.check_admin(raw.headers.get("authorization"))
    except AuthError as e:
        raise APIError(403, str(e), "permission_error") from None
    if not await on_engine(state, flush):
        raise APIError(400, f"cannot {what} while requests are running or waiting")
    if state.metrics is not None:
        state.metrics.resets.inc()


def tenant_of(state: ServerState, raw: HTTPRequest) -> str | None:
    try:
        return state.tenants.tenant_of(raw.headers.get("authorization"))
    except AuthError as e:
        raise APIError(401, str(e), "authentication_error") from None


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise APIError(404, f"The model `{model}` does not exist; this server serves "
                            f"`{state.model_name}`", "not_found_error", "model")


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


LARGE_PROMPT_CHARS = 1 << 16    # a longer prompt is tokenized on a worker thread


async def checked_request(state: ServerState, raw: HTTPRequest, body, chat: bool) -> Request:
    """make_request; a large prompt's (tokenizing it takes milliseconds per 100 KB) on a worker
    thread, so the event loop keeps serving the other streams meanwhile."""
    if _prompt_chars(body, chat) <= LARGE_PROMPT_CHARS:
        return make_request(state, raw, body, chat)
    req, err = await asyncio.to_thread(_make_off_loop, state, raw, body, chat)
    if err is not None:
        raise err
    return req


def _make_off_loop(state: ServerState, raw: HTTPRequest, body, chat: bool):
    """(request, None) or (None, a fresh copy of the APIError): the original's traceback, and
    the prompt's token ids its frames hold, are freed here rather than on the event loop
    (freeing 10 M ids takes ~0.1 s)."""
    try:
        return make_request(state, raw, body, chat), None
    except APIError as e:
        return None, APIError(e.status, e.message, e.kind, e.param)


def _prompt_chars(body, chat: bool) -> int:
    if chat:
        return sum(len(m.text()) for m in body.messages)
    return len(body.prompt)                  # characters, or token ids to check


def _over_context(state: ServerState, n: int, max_tokens: int) -> APIError:
    return APIError(400, f"This model's maximum context length is {state.max_model_len} tokens. "
                         f"However, you requested {n + max_tokens} tokens ({n} in the prompt, "
                         f"{max_tokens} for the completion).", param="max_tokens")


def _refuse_over_context(state: ServerState, body) -> None:
    """A long text prompt is counted before it is tokenized: one the context cannot hold is
    refused without building its token ids (10 MB of text: 10 M ids, ~0.3 s of work holding
    the GIL — the event loop's and the engine thread's too)."""
    n = state.tokenizer.count(body.prompt, add_bos=state.tokenizer.bos_id is not None)
    if n >= state.max_model_len:                 # with any max_tokens (at least 1)
        raise _over_context(state, n, body.limit() or 1)


def _release(ids: list[int]) -> None:
    """Empty a refused prompt's ids a slice at a time: freeing 10 M of them at once holds the
    GIL for ~0.1 s, and the event loop and the engine thread with it."""
    while len(ids) > LARGE_PROMPT_CHARS:
        del ids[-LARGE_PROMPT_CHARS:]


def make_request(state: ServerState, raw: HTTPRequest, body, chat: bool) -> Request:
    tenant = tenant_of(state, raw)
    check_model(state, body.model)
    msg = body.unsupported()
    if msg:
        raise APIError(400, msg)
    if not chat and isinstance(body.prompt, str) and len(body.prompt) > LARGE_PROMPT_CHARS:
        _refuse_over_context(state, body)
    ids = prompt_ids(state, body, chat)
    if not ids:
        raise APIError(400, "the prompt is empty", param="prompt")
    limit = body.limit()
    max_tokens = limit or body.default_max_tokens
    if limit is None:                               # a default never overruns the context
        max_tokens = max(min(max_tokens, state.max_model_len - len(ids)), 1)
    if len(ids) + max_tokens > state.max_model_len:
        n = len(ids)
        _release(ids)
        raise _over_context(state, n, max_tokens)
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

