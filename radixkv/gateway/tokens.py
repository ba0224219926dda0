"""The token ids the gateway routes a request on: a prompt of token ids as it is; text through
the tokenizer the workers use — a local one (`--tokenizer DIR`: its tokenizer.json, and the chat
template of its tokenizer_config.json, else the plain one) or the workers' own vLLM endpoints
(`/tokenize` for a prompt; for chat messages `/tokenize`, else `/v1/chat/completions/render`),
so a chat is rendered with the template the worker uses."""
from __future__ import annotations

import json

import httpx
from pydantic import ValidationError

from radixkv.model.tokenizer import load_tokenizer
from radixkv.server.protocol import ChatMessage
from radixkv.server.text import ChatTemplate


class TokenizeError(Exception):
    """The worker refused to tokenize the request: its response is the client's answer."""

    def __init__(self, response: httpx.Response):
        super().__init__(f"tokenize: {response.status_code}")
        self.response = response


class Tokens:
    def __init__(self, tokenizer_dir: str | None = None):
        self.tok = self.template = None
        if tokenizer_dir is not None:
            self.tok = load_tokenizer(tokenizer_dir)
            self.template = ChatTemplate.for_model(self.tok, tokenizer_dir)

    async def of(self, client: httpx.AsyncClient, worker: str, body: dict, chat: bool
                 ) -> list[int]:
        if not chat:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return prompt
            if self.tok is not None and isinstance(prompt, str):
                return self.tok.encode(prompt, add_bos=self.tok.bos_id is not None)
            return await self._remote(client, worker, "/tokenize",
                                      {"model": body.get("model"), "prompt": prompt})
        messages = body.get("messages")
        if self.template is not None and isinstance(messages, list):
            try:
                msgs = [ChatMessage.model_validate(m) for m in messages]
            except ValidationError:              # the worker words the refusal
                msgs = None
            if msgs is not None:
                return self.template.encode([(m.role, m.text()) for m in msgs])
        try:
            return await self._remote(client, worker, "/tokenize",
                                      {"model": body.get("model"), "messages": messages})
        except TokenizeError as e:
            if e.response.status_code != 404:
                raise
        got = await self._post(client, f"{worker}/v1/chat/completions/render", body)
        return got["token_ids"]

    async def _remote(self, client, worker: str, path: str, body: dict) -> list[int]:
        return (await self._post(client, f"{worker}{path}", body))["tokens"]

    @staticmethod
    async def _post(client: httpx.AsyncClient, url: str, body: dict) -> dict:
        # json.dumps, not httpx's json=: NaN and lone surrogates (which a client may send, and
        # the worker refuses with a 400) must not fail the encoding here
        r = await client.post(url, content=json.dumps(body).encode(),
                              headers={"content-type": "application/json"})
        if r.status_code != 200:
            raise TokenizeError(r)
        return r.json()
