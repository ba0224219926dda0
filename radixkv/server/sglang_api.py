"""SGLang's own endpoints, in SGLang's shapes, for its router and benchmark clients.

- `GET /model_info` (and the older `/get_model_info`): the model path, served name, tokenizer.
- `GET /get_server_info` (and radixkv's `/server_info`): the resolved configuration under
  SGLang's keys too (`model_path`, `served_model_name`, `page_size`, `max_total_num_tokens`,
  `max_running_requests`, `context_length`), with the live figures in `internal_states`.
- `GET /get_load`: `[{dp_rank, num_reqs, num_waiting_reqs, num_tokens, num_pending_tokens,
  ts_tic}]`, what sglang-router's load-aware policies poll; `GET /v1/loads`: the same under
  `loads`, with a timestamp and the version.
- `POST /generate`: `text` or `input_ids`, `sampling_params`, `stream`; the reply is `{text,
  output_ids, meta_info}` (each streamed chunk holds the text so far), meta_info carrying the
  prompt, completion and cached tokens (`cached_tokens_details` by where they were found) and a
  finish reason as SGLang writes it. Checked exactly as `/v1/completions` checks its requests.
"""
from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import Response
from pydantic import ValidationError

from radixkv import __version__
from radixkv.sched.request import Request
from radixkv.server import protocol as P
from radixkv.server.guard import RID_KEY
from radixkv.server.state import (APIError, ServerState, checked_request, engine_down,
                                  error_event, error_message, on_engine, tenant_of)
from radixkv.server.text import Detokenizer
from radixkv.server.updates import ClosingStreamingResponse, UpdateQueue
from radixkv.server.worker import Update, engine_stats


def add_sglang_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info(raw: HTTPRequest):
        tenant_of(state, raw)
        info = state.info
        return {"model_path": info.get("model_source", state.model_name),
                "served_model_name": state.model_name,
                "tokenizer_path": info.get("tokenizer", {}).get("path"),
                "is_generation": True, "preferred_sampling_params": None,
                "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "llama",
                "architectures": ["LlamaForCausalLM"]}

    @app.get("/get_server_info")
    async def get_server_info():
        live = await on_engine(state, engine_stats)
        return {**state.info, **sglang_keys(state), "version": __version__,
                "internal_states": [{"num_running_reqs": live["running"],
                                     "num_waiting_reqs": live["waiting"], **live}],
                "live": live}

    @app.get("/get_load")
    async def get_load():
        return [await _load(state)]

    @app.get("/v1/loads")
    async def loads():
        return {"timestamp": datetime.now(timezone.utc).isoformat(), "version": __version__,
                "loads": [await _load(state)]}

    @app.post("/generate")
    async def generate(raw: HTTPRequest):
        try:
            body = P.GenerateRequest.model_validate(await raw.json())
            comp = body.as_completion()
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            raise APIError(400, f"{where}: {first.get('msg')}" if where else first.get("msg"),
                           param=where or None) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:      # not JSON, or not UTF-8
            raise APIError(400, f"the body is not valid JSON: {e}") from None
        req = await checked_request(state, raw, comp, chat=False)
        raw.scope.setdefault("state", {})[RID_KEY] = req.rid
        down = engine_down(state)
        if down is not None:
            raise down
        q = UpdateQueue(state.worker, req, asyncio.get_running_loop())
        state.worker.submit(req, q.deliver)
        run = _Run(state, req, q, body.return_cached_tokens_details)
        if body.stream:
            return ClosingStreamingResponse(run.stream(), media_type="text/event-stream")
        return await run.whole(raw)


def sglang_keys(state: ServerState) -> dict:
    """SGLang's names for the figures its clients read off /get_server_info."""
    eng = state.worker.engine
    return {"model_path": state.info.get("model_source", state.model_name),
            "page_size": eng.config.cache.page_size, "max_total_num_tokens": eng.pool.num_slots,
            "max_running_requests": eng.config.sched.max_running_requests,
            "context_length": state.max_model_len, "served_model_name": state.model_name}


async def _load(state: ServerState) -> dict:
    live = await on_engine(state, _load_of)
    return {"dp_rank": 0, **live, "ts_tic": time.time()}


def _load_of(eng) -> dict:
    sch = eng.sched
    return {"num_reqs": sch.num_admitted + len(sch.waiting), "num_waiting_reqs": len(sch.waiting),
            "num_tokens": eng.pool.used() - eng.cache.evictable_size(),
            "num_pending_tokens": sum(r.prompt_len for r in sch.waiting)}


class _Run:
    """One /generate request's replies, as SGLang writes them."""

    def __init__(self, state: ServerState, req: Request, q: UpdateQueue, details: bool):
        self.state, self.req, self.q, self.details = state, req, q, details
        self.detok, self.text, self.ids = Detokenizer(state.tokenizer), [], []
        self.start = time.monotonic()

    def _push(self, u: Update) -> dict:
        self.ids.extend(u.tokens)
        self.text.append(self.detok.push(u.tokens, final=u.finish_reason is not None))
        r = self.req
        use = u.usage or (r.prompt_len, len(self.ids), r.cached_tokens)
        meta = {"id": r.rid, "finish_reason": _finish(u.finish_reason, len(self.ids)),
                "prompt_tokens": use[0], "completion_tokens": use[1], "cached_tokens": use[2],
                "e2e_latency": time.monotonic() - self.start}
        if self.details:
            meta.update(P.sglext(use[2], r.host_hit_tokens))
        return {"text": "".join(self.text), "output_ids": list(self.ids), "meta_info": meta}

    async def whole(self, raw: HTTPRequest):
        finished = False
        try:
            while True:
                try:
                    u = await asyncio.wait_for(self.q.get(), 0.25)
                except asyncio.TimeoutError:
                    if await raw.is_disconnected():
                        return Response(status_code=499)
                    continue
                out = self._push(u)
                if u.finish_reason is not None:
                    finished = True
                    if u.finish_reason == "error":
                        raise APIError(500, error_message(self.state, u), "server_error")
                    return out
        finally:
            if not finished:
                self.state.worker.abort(self.req)

    async def stream(self):
        finished = False
        try:
            while True:
                u = await self.q.get()
                if u.finish_reason == "error":   # the engine failed: an error event, then [DONE]
                    finished = True
                    yield error_event(self.state, u)
                    yield "data: [DONE]\n\n"
                    return
                out = self._push(u)
                if u.tokens or u.finish_reason is not None:
                    yield f"data: {json.dumps(out, separators=(',', ':'))}\n\n"
                if u.finish_reason is not None:
                    finished = True
                    yield "data: [DONE]\n\n"
                    return
        finally:
            if not finished:            # the client went away
                self.state.worker.abort(self.req)


def _finish(reason: str | None, length: int) -> dict | None:
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": length}
    if reason == "stop":
        return {"type": "stop", "matched": None}
    return {"type": "abort", "message": reason}
