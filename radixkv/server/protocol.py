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

from pydantic import BaseModel, ConfigDict, Field, field_validator

COMPLETION_DEFAULT_MAX_TOKENS = 16      # OpenAI's documented default for /v1/completions
CHAT_DEFAULT_MAX_TOKENS = 128           # SGLang's default max_new_tokens


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


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None

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


# ---- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: int = 400) -> dict:
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
