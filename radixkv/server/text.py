"""Text in and out of the server: the chat template and incremental detokenization.

The tiny models (byte tokenizer) use a plain documented template, one block per message and
an open assistant block at the end:

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n

preceded by the BOS token. A checkpoint directory with a Jinja chat template uses it instead
(rendered with `messages`, `bos_token`, `eos_token` and `add_generation_prompt=True`), as vLLM
and SGLang do: its `chat_template.jinja` (where transformers 5 writes it), else the
`chat_template` of its tokenizer_config.json.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

PLAIN_TEMPLATE = "<|{role}|>\n{content}\n"
JINJA_FILE = "chat_template.jinja"         # a checkpoint's template, as transformers 5 saves it


class ChatTemplate:
    def __init__(self, tokenizer, jinja_source: str | None = None,
                 bos_token: str = "", eos_token: str = ""):
        self.tok, self.source = tokenizer, jinja_source
        self._bos, self._eos = bos_token, eos_token
        self._template = None
        if jinja_source is not None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise       # what HF templates call on bad input
            self._template = env.from_string(jinja_source)

    @classmethod
    def for_model(cls, tokenizer, model_dir: str | None) -> "ChatTemplate":
        """The checkpoint's own template when it has one, else the plain one."""
        if model_dir is None:
            return cls(tokenizer)
        cfg, jinja = Path(model_dir) / "tokenizer_config.json", Path(model_dir) / JINJA_FILE
        obj: dict = {}
        if cfg.is_file():
            try:
                obj = json.loads(cfg.read_text(encoding="utf-8"))
            except json.JSONDecodeError as e:
                raise ValueError(f"{cfg}: malformed JSON ({e})") from None
        src = jinja.read_text(encoding="utf-8") if jinja.is_file() else obj.get("chat_template")
        if not isinstance(src, str):
            return cls(tokenizer)

        def tok(name):
            v = obj.get(name) or ""
            return v.get("content", "") if isinstance(v, dict) else v
        return cls(tokenizer, src, tok("bos_token"), tok("eos_token"))

    @property
    def name(self) -> str:
        return "checkpoint" if self.source is not None else "plain"

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """The prompt text; ValueError when the checkpoint's template refuses the messages
        (a role order it does not allow, ...)."""
        if self._template is not None:
            from jinja2 import TemplateError
            try:
                return self._template.render(
                    messages=[{"role": r, "content": c} for r, c in messages],
                    bos_token=self._bos, eos_token=self._eos, add_generation_prompt=True)
            except TemplateError as e:
                raise ValueError(f"the chat template refused the messages: {e}") from None
        return "".join(PLAIN_TEMPLATE.format(role=r, content=c) for r, c in messages) \
            + "<|assistant|>\n"

    def encode(self, messages: Sequence[tuple[str, str]]) -> list[int]:
        text = self.render(messages)
        # a Jinja template writes its own BOS text; the plain one gets the BOS id
        return self.tok.encode(text, add_bos=self._template is None and self.tok.bos_id is not None)


def _raise(message: str):
    from jinja2 import TemplateError
    raise TemplateError(message)


class Detokenizer:
    """Text of a growing list of output ids, handed out as deltas. A delta that ends inside a
    multi-byte character (decoded as U+FFFD) is held back until the character completes."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.sent = 0                    # characters handed out

    def push(self, ids: Sequence[int], final: bool = False) -> str:
        # ids a checkpoint's model may produce beyond its tokenizer's vocabulary have no text
        self.ids.extend(i for i in ids if i < self.tok.vocab_size)
        text = self.tok.decode(self.ids)
        end = len(text)
        if not final:
            while end > self.sent and text[end - 1] == "\ufffd":
                end -= 1
        delta, self.sent = text[self.sent:end], max(self.sent, end)
        return delta
