"""The token ids the gateway routes a request on: a prompt of token ids as it is; text through
the tokenizer the workers use — a local one (`--tokenizer DIR`: its tokenizer.json, and the chat
template of its tokenizer_config.json, else the plain one) or the workers' own vLLM endpoints
(`/tokenize` for a prompt; for chat messages `/tokenize`, else `/v1/chat/completions/render`),
so a chat is rendered with the template the worker uses."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
from pydantic import ValidationError

from radixkv.tokenizer import load_tokenizer
from radixkv.server.protocol import ChatMessage
from radixkv.server.text import ChatTemplate


class TokenizeError(Exception):
    """The worker refused to tokenize the request: its response is the client's answer."""

    def __init__(self, status: int, content: bytes, content_type: str | None):
        super().__init__(f"tokenize: {status}")
        self.status, self.content, self.content_type = status, content, content_type


class Tokens:
    def __init__(self, tokenizer_dir: str | None = None):
        self.tok = self.template = None
        if tokenizer_dir is not None:
            self.tok = load_tokenizer(tokenizer_dir)
            self.template = ChatTemplate.for_model(self.tok, tokenizer_dir)

    async def of(self, session: aiohttp.ClientSession, worker: str, body: dict, chat: bool,
                 asked: Callable[[str], None] | None = None) -> list[int]:
        """The ids of `body` (a completion, or a chat when `chat`), from `worker` unless they
        need no worker; `asked(worker)` is told each time the worker is asked."""
        if not chat:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                return prompt
            if self.tok is not None and isinstance(prompt, str):
                try:
                    return await _local(len(prompt), self.tok.encode, prompt,
                                        self.tok.bos_id is not None)
                except (TypeError, UnicodeEncodeError):  # a lone surrogate: the worker words
                    pass                                  # the refusal (a 400)
            return await self._remote(session, worker, "/tokenize",
                                      {"model": body.get("model"), "prompt": prompt}, asked)
        messages = body.get("messages")
        if self.template is not None and isinstance(messages, list):
            try:
                msgs = [ChatMessage.model_validate(m) for m in messages]
            except ValidationError:              # the worker words the refusal
                msgs = None
            if msgs is not None:
                turns = [(m.role, m.text()) for m in msgs]
                return await _local(sum(len(t) for _, t in turns), self.template.encode, turns)
        try:
            return await self._remote(session, worker, "/tokenize",
                                      {"model": body.get("model"), "messages": messages}, asked)
        except TokenizeError as e:
            if e.status != 404:
                raise
        if asked is not None:
            asked(worker)
        got = await self._post(session, f"{worker}/v1/chat/completions/render", body)
        return got["token_ids"]

    async def _remote(self, session, worker: str, path: str, body: dict,
                      asked: Callable[[str], None] | None) -> list[int]:
        if asked is not None:
            asked(worker)
        return (await self._post(session, f"{worker}{path}", body))["tokens"]

    @staticmethod
    async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
        # json.dumps with its defaults: NaN and lone surrogates (which a client may send, and
        # the worker refuses with a 400) must not fail the encoding here
        async with session.post(url, data=json.dumps(body).encode(),
                                headers={"content-type": "application/json"}) as r:
            content = await r.read()
            if r.status != 200:
                raise TokenizeError(r.status, content, r.headers.get("content-type"))
        return json.loads(content)


# a text up to this many characters is tokenized on the event loop (~1.5 ms of byte-level BPE
# at most); a longer one on a thread, the loop relaying meanwhile. Below it a thread hop costs
# more than it frees: under load its way back waits for the GIL while the loop relays
INLINE_CHARS = 16_384


async def _local(chars: int, encode, *args) -> list[int]:
    """encode(*args) with the local tokenizer, on a thread past INLINE_CHARS characters."""
    return await asyncio.to_thread(encode, *args) if chars > INLINE_CHARS else encode(*args)
