"""vLLM's own endpoints beside the OpenAI API, in vLLM's request and response shapes.

- `POST /tokenize`: a `prompt` (special tokens added unless `add_special_tokens` is false) or
  chat `messages` (rendered with the server's chat template) -> `{count, max_model_len, tokens,
  token_strs}`: exactly the ids a completion or chat request with that input runs on.
- `POST /detokenize`: `{tokens}` -> `{prompt}`.
- `POST /v1/completions/render`, `POST /v1/chat/completions/render` (what vllm-router asks every
  worker for the token ids it routes on): the request as the engine would run it — `token_ids`,
  `sampling_params`, `model`, `stream` — checked as the generation endpoints check it, nothing
  run; the completions form answers a list of one.
- `POST /reset_prefix_cache`: drop the prefix cache (KV events: AllBlocksCleared), as
  `/flush_cache`; with tenants it needs an operator key.
- `GET /version`.
"""
from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import Response

from radixkv import __version__
from radixkv.server import protocol as P
from radixkv.server.state import (LARGE_PROMPT_CHARS, APIError, ServerState, check_model,
                                  checked_request, prompt_ids, reset_cache, tenant_of)


def add_vllm_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/tokenize")
    async def tokenize(body: P.TokenizeRequest, raw: HTTPRequest):
        tenant_of(state, raw)
        check_model(state, body.model)
        tok = state.tokenizer
        chars = sum(len(m.text()) for m in body.messages) if body.messages is not None \
            else len(body.prompt)
        if chars > LARGE_PROMPT_CHARS:               # off the event loop, as checked_request
            ids = await asyncio.to_thread(_token_ids, state, body)
        else:
            ids = _token_ids(state, body)
        strs = [tok.decode([t], skip_special=False) for t in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids,
                "token_strs": strs}

    @app.post("/detokenize")
    async def detokenize(body: P.DetokenizeRequest, raw: HTTPRequest):
        tenant_of(state, raw)
        check_model(state, body.model)
        bad = next((t for t in body.tokens if not 0 <= t < state.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary [0, {state.vocab_size})",
                           param="tokens")
        return {"prompt": state.tokenizer.decode(body.tokens)}

    @app.post("/v1/completions/render")
    async def render_completion(body: P.CompletionRequest, raw: HTTPRequest):
        return [_rendered(state, await checked_request(state, raw, body, chat=False), body)]

    @app.post("/v1/chat/completions/render")
    async def render_chat(body: P.ChatCompletionRequest, raw: HTTPRequest):
        return _rendered(state, await checked_request(state, raw, body, chat=True), body)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(raw: HTTPRequest):
        await reset_cache(state, raw, "reset the prefix cache")
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": __version__}


def _token_ids(state: ServerState, body: P.TokenizeRequest) -> list[int]:
    tok = state.tokenizer
    if body.messages is not None:
        ids = prompt_ids(state, body, chat=True)
        if body.add_special_tokens and tok.bos_id is not None and ids[:1] != [tok.bos_id]:
            ids = [tok.bos_id, *ids]
        return ids
    return tok.encode(body.prompt, add_bos=body.add_special_tokens is not False and
                      tok.bos_id is not None)


def _rendered(state: ServerState, req, body) -> dict:
    """vLLM's GenerateRequest for a checked request (nothing is submitted)."""
    return {"request_id": req.rid, "token_ids": list(req.tokens), "model": state.model_name,
            "sampling_params": {"max_tokens": req.max_new_tokens, "temperature": body.temperature,
                                "top_p": body.top_p, "top_k": body.top_k, "seed": body.seed,
                                "ignore_eos": body.ignore_eos,
                                "stop_token_ids": list(body.stop_token_ids)},
            "stream": body.stream, "cache_salt": body.cache_salt, "priority": 0}
