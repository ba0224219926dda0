"""The OpenAI API's request and response bodies, as vLLM and SGLang serve them (pydantic).

Requests refuse what radixkv does not do (n > 1, logprobs, echo, stop strings, tools) with a
400 naming the field, rather than ignoring it; unknown fields are accepted and ignored, as
both engines do, so clients that send extras keep working. `ignore_eos`, `top_k`,
`stop_token_ids` and `cache_salt` are the vLLM extensions; `cache_scope` is radixkv's
("tenant", or "shared": the operator's shared namespace).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

COMPLETION_DEFAULT_MAX_TOKENS = 16      # OpenAI's documented default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 128           # SGLang's default max_new_tokens


def _utf8(v):
    """`v`, if it is text a tokenizer can encode (JSON's "\ud800" is a lone surrogate: not)."""
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text holds a lone surrogate {v[e.start]!r} at index "
                             f"{e.start}: it is not valid UTF-8") from None
    return v


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1)                 # -1 or 0: off (vLLM uses -1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    cache_salt: str | None = Field(default=None, min_length=1, max_length=256)
    cache_scope: Literal["tenant", "shared"] = "tenant"
    return_cached_tokens_details: bool = False            # SGLang's: sglext.cached_tokens_details
    user: str | None = None
    # refused when set to anything but their no-op values
    n: int = 1
    best_of: int | None = None
    logprobs: Any = None
    top_logprobs: int | None = None
    echo: bool = False
    stop: str | list[str] | None = None
    tools: list | None = None

    @field_validator("stop_token_ids")
    @classmethod
    def _ids(cls, v: list[int]) -> list[int]:
        bad = [i for i in v if i < 0]
        if bad:
            raise ValueError(f"stop_token_ids must be >= 0, got {bad[0]}")
        return v

    def unsupported(self) -> str | None:
        """The first field set to something radixkv does not do, or None."""
        if self.n != 1:
            return f"n={self.n}: only n=1 is supported"
        if self.best_of not in (None, 1):
            return f"best_of={self.best_of}: only 1 is supported"
        if (self.logprobs is not None and self.logprobs is not False) or self.top_logprobs:
            return "logprobs are not supported"
        if self.echo:
            return "echo is not supported"
        if self.stop:
            return "stop strings are not supported; use stop_token_ids"
        if self.tools:
            return "tools are not supported"
        return None

    def limit(self) -> int | None:
        """The output limit the client set, if any."""
        return self.max_tokens


class CompletionRequest(SamplingFields):
    default_max_tokens: ClassVar[int] = COMPLETION_DEFAULT_MAX_TOKENS
    prompt: str | list[int] = Field(min_length=1)
    _prompt_utf8 = field_validator("prompt")(_utf8)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str
    _text_utf8 = field_validator("text")(_utf8)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    _content_utf8 = field_validator("content")(_utf8)

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    default_max_tokens: ClassVar[int] = CHAT_DEFAULT_MAX_TOKENS
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


# ---- vLLM's tokenizer endpoints and SGLang's native /generate -----------------------------------
class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a `prompt`, or chat `messages` rendered with the server's template."""
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    _prompt_utf8 = field_validator("prompt")(_utf8)
    add_special_tokens: bool | None = None      # vLLM: True for a prompt, False for messages
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if self.messages is not None and not self.add_generation_prompt:
            raise ValueError("add_generation_prompt=false is not supported: the server's chat "
                             "template always opens the assistant's turn")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)


class SGLangSampling(BaseModel):
    """SGLang's sampling_params, as far as radixkv samples (unknown keys ignored, as SGLang's
    clients send many)."""
    model_config = ConfigDict(extra="ignore")
    max_new_tokens: int = Field(default=CHAT_DEFAULT_MAX_TOKENS, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    n: int = 1


class GenerateRequest(BaseModel):
    """SGLang's native /generate: `text` or `input_ids`, `sampling_params`, `stream`."""
    model_config = ConfigDict(extra="ignore")
    text: str | None = None
    input_ids: list[int] | None = None
    _text_utf8 = field_validator("text")(_utf8)
    sampling_params: SGLangSampling = Field(default_factory=SGLangSampling)
    stream: bool = False
    return_cached_tokens_details: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> "GenerateRequest":
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of text and input_ids")
        return self

    def as_completion(self) -> CompletionRequest:
        """The same request as /v1/completions takes it (one set of checks for both)."""
        sp = self.sampling_params
        return CompletionRequest(
            prompt=self.text if self.text is not None else self.input_ids,
            max_tokens=sp.max_new_tokens, temperature=sp.temperature, top_p=sp.top_p,
            top_k=sp.top_k, ignore_eos=sp.ignore_eos, stop_token_ids=sp.stop_token_ids or [],
            stop=sp.stop, n=sp.n, return_cached_tokens_details=self.return_cached_tokens_details)


# ---- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sglext(cached: int, host: int) -> dict:
    """SGLang's extension of a response: the cached prompt tokens by where they were found."""
    return {"cached_tokens_details": {"device": cached - host, "host": host}}


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: int = 400) -> dict:
    # a message may quote the client (a model name): a lone surrogate in it is written escaped,
    # or the error's own encoding would fail (a 500, the connection dropped)
    message = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"object": "error", "error": {"message": message, "type": kind, "param": param,
                                         "code": code}}


def completion_chunk(rid: str, model: str, text: str, finish: str | None, *,
                     chat: bool, created: int, role: bool = False) -> dict:
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, model: str, use: dict, *, chat: bool, created: int) -> dict:
    obj = "chat.completion.chunk" if chat else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": use}


def completion_body(rid: str, model: str, text: str, finish: str, use: dict, *,
                    chat: bool, created: int) -> dict:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": use}


def model_list(name: str, max_model_len: int) -> dict:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                        "owned_by": "radixkv", "root": name,
                                        "max_model_len": max_model_len}]}
