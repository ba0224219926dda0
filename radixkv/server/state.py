"""What every route of the server shares: its state (`ServerState`), the error a route raises
(`APIError`, answered with an OpenAI-style body), the cache flush, and the checks that turn a
request body into an engine `Request` — auth, model, fields, token ids, context, pool — before
anything reaches the engine thread, so bad input gets a 4xx and changes nothing."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from radixkv.sched.request import Request
from radixkv.server import protocol as P
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


def error_response(status: int, message: str, kind: str = "invalid_request_error",
           param: str | None = None) -> JSONResponse:
    return JSONResponse(P.error_body(message, kind, param, status), status_code=status)


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
    if not await asyncio.wrap_future(state.worker.call(flush)):
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


def make_request(state: ServerState, raw: HTTPRequest, body, chat: bool) -> Request:
    tenant = tenant_of(state, raw)
    check_model(state, body.model)
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
