"""OpenAI chat logs: one chat-completions request per line, turned into token-id requests.

A line is a JSON object with
    messages    a non-empty list of {"role": str, "content": ...} as in OpenAI's chat API;
                content is a string, null (empty) or a list of {"type": "text", "text": str}
                parts (joined without a separator), and may be left out only beside
                `tool_calls` (empty then); other message keys are ignored
    timestamp   optional: a number, in seconds or milliseconds (`timestamp_unit`), or an
                ISO-8601 date-time string (UTC unless it carries an offset)
    user        optional str: the request's session and routing key
    id          optional non-empty str, unique in the file (default "<file stem>-<line>")
    output_len, max_completion_tokens, max_tokens
                optional ints, the first present one giving the output length of a request
                without a recorded reply (default `DEFAULT_OUTPUT_LEN`)
Other keys (model, temperature, ...) are ignored.

Mapping. If the last message is from the assistant it is the recorded reply: the request's
output is its tokens and the prompt is every message before it. Otherwise the prompt is all
the messages and the output is `output_len` tokens not known in advance (output=None).
The prompt text is, per message, ROLE_TEMPLATE = "<|{role}|>\\n{content}\\n", followed by the
generation prompt GENERATION_PROMPT = "<|assistant|>\\n"; the prompt tokens are
tokenizer.encode(text, add_bos=add_bos) and the output tokens tokenizer.encode(reply).

Prefix sharing. A conversation's next turn re-sends the earlier messages and the recorded
reply, so its prompt text starts with the previous prompt text + the reply text. Its tokens
start with the previous prompt tokens + reply tokens when the tokenizer is prefix-stable at
those boundaries: encode(a + b) == encode(a) + encode(b) where a ends with a template "\\n"
or a reply and b starts a reply or with "\\n". Pre-tokenizers that split at whitespace
(WordLevel or BPE with `Whitespace`, GPT-2 style `ByteLevel`) have this property; a
tokenizer that merges across a newline, or marks the start of every encode call (a
SentencePiece "▁" prefix, an added BOS with add_bos=True on the reply), shares a few
tokens less at each boundary.

Numeric timestamps are seconds or milliseconds as `timestamp_unit` says ("s", "ms"); left
None, the unit is found from their size: every one at least EPOCH_MS_FLOOR (1e11, which is
the year 5138 in seconds and March 1973 in milliseconds) means epoch milliseconds, none means
seconds, some of each is refused. `Workload.meta["timestamp_unit"]` holds the unit used and
`meta["timestamp_unit_detected"]` whether it was found rather than given, so that a caller
can say so.

Arrivals are timestamps minus the earliest timestamp in the file. A line without one
arrives with the line before it (file order is kept); lines before the first timestamp, or
all lines when there is none, arrive at 0.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from radixkv.argcheck import choice, is_number, optional_str
from radixkv.tokenizer import load_tokenizer

from .record import TraceRequest, Workload, json_line, parse_lines, token_count

ROLE_TEMPLATE = "<|{role}|>\n{content}\n"
GENERATION_PROMPT = "<|assistant|>\n"
DEFAULT_OUTPUT_LEN = 256
OUTPUT_LEN_KEYS = ("output_len", "max_completion_tokens", "max_tokens")


class TextEncoder(Protocol):
    """What the reader needs of a tokenizer (radixkv.tokenizer's satisfy it)."""

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


def render_prompt(messages: list[ChatMessage]) -> str:
    """The prompt text of `messages`: the template per message, then the generation prompt."""
    return "".join(ROLE_TEMPLATE.format(role=m.role, content=m.content) for m in messages) \
        + GENERATION_PROMPT


def _content(v: Any, where: str) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        parts = []
        for i, part in enumerate(v):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ValueError(f"{where}.content[{i}] is not a text part "
                                 f"({{'type': 'text', 'text': str}}), got {kind!r}")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"{where}.content must be a string, null or a list of text parts, "
                     f"got {type(v).__name__}")


def parse_messages(v: Any) -> list[ChatMessage]:
    """Validate an OpenAI `messages` list; ValueError naming the bad message."""
    if not isinstance(v, list) or not v:
        raise ValueError(f"messages must be a non-empty list, got {v!r:.60}")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where} must be an object with role and content, "
                             f"got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise ValueError(f"{where}.role must be a non-empty string, got {role!r}")
        if "content" not in m and "tool_calls" not in m:
            raise ValueError(f"{where} (role {role!r}) has no 'content'; an empty message is "
                             f"written \"content\": \"\" or null")
        out.append(ChatMessage(role, _content(m.get("content"), where)))
    return out


def parse_timestamp(v: Any) -> float:
    """A finite number as is (its unit is the caller's), an ISO-8601 string as POSIX seconds
    (UTC if naive)."""
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(f"timestamp {v!r} is neither a number nor an ISO-8601 "
                             f"date-time") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return dt.timestamp()
    try:
        ok = is_number(v) and math.isfinite(v)
    except OverflowError:   # an int beyond float range
        ok = False
    if not ok:
        raise ValueError(f"timestamp must be a finite number or an ISO-8601 string, "
                         f"got {v!r}")
    return float(v)


EPOCH_MS_FLOOR = 1e11
TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e-3}


@dataclass(frozen=True, slots=True)
class _Row:
    request: TraceRequest   # arrival 0 until the file's time origin is known
    time: float | None      # seconds, or the number as written when `numeric`
    numeric: bool
    lineno: int


def _timestamp_unit(rows: list[_Row], path: Path, unit: str | None) -> tuple[str, bool]:
    """(the unit of the numeric timestamps, whether it was detected); see the module doc."""
    if unit is not None:
        if unit not in TIMESTAMP_UNITS:
            raise ValueError(f"unknown timestamp unit {unit!r}; valid: "
                             f"{', '.join(TIMESTAMP_UNITS)}")
        return unit, False
    nums = [r for r in rows if r.numeric]
    big = next((r for r in nums if abs(r.time) >= EPOCH_MS_FLOOR), None)   # type: ignore[arg-type]
    small = next((r for r in nums if abs(r.time) < EPOCH_MS_FLOOR), None)  # type: ignore[arg-type]
    if big is not None and small is not None:
        raise ValueError(f"{path}: timestamps mix sizes: line {small.lineno} has {small.time:g} "
                         f"(seconds?) and line {big.lineno} {big.time:g} (epoch milliseconds?); "
                         f"give the unit (timestamp_unit, --timestamp-unit s or ms)")
    return ("ms" if big is not None else "s"), big is not None


def read_chat_log(path: str | Path, tokenizer: TextEncoder, skip_bad: bool = False,
                  default_output_len: int = DEFAULT_OUTPUT_LEN, add_bos: bool = False,
                  timestamp_unit: str | None = None) -> Workload:
    """Read an OpenAI chat log (see the module doc) into a Workload of token-id requests.

    A bad line raises TraceFormatError("<file>:<line>: <what>"), or with skip_bad=True is
    dropped and counted in `Workload.skipped`; duplicate ids count as bad (the later line).
    Prompt + output are bounded by MAX_REQUEST_TOKENS per request. `timestamp_unit`: "s",
    "ms" or None (found from the numbers' size, see the module doc). `tokenizer` is an
    encoder or the path of a tokenizer.json (or of a directory holding one).
    """
    default_output_len = token_count(default_output_len, "default_output_len")
    if timestamp_unit is not None:
        choice(timestamp_unit, "timestamp unit", TIMESTAMP_UNITS)
    path = Path(path)
    if isinstance(tokenizer, (str, Path)):
        tokenizer = load_tokenizer(tokenizer)
    ids: set[str] = set()

    def parse(line: str, lineno: int) -> _Row:
        d = json_line(line)
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        if "messages" not in d:
            raise ValueError("missing field 'messages'")
        messages = parse_messages(d["messages"])
        rid = d.get("id", f"{path.stem}-{lineno}")
        if not isinstance(rid, str) or not rid:
            raise ValueError(f"id must be a non-empty string, got {rid!r}")
        if rid in ids:
            raise ValueError(f"duplicate request id {rid!r}")
        user = optional_str(d.get("user"), "user")
        stamp = d.get("timestamp")
        time = None if stamp is None else parse_timestamp(stamp)
        output: list[int] | None = None
        n_out = default_output_len
        if messages[-1].role == "assistant":
            if len(messages) == 1:
                raise ValueError("messages hold only an assistant reply: no prompt")
            output = tokenizer.encode(messages[-1].content)
            messages = messages[:-1]
        else:
            key = next((k for k in OUTPUT_LEN_KEYS if d.get(k) is not None), None)
            if key is not None:
                n_out = token_count(d[key], key)
        prompt = tokenizer.encode(render_prompt(messages), add_bos=add_bos)
        token_count(len(prompt), "prompt length")
        r = TraceRequest(rid, 0.0, prompt, output, None if output is not None else n_out,
                         routing_key=user, session=user)
        ids.add(rid)
        return _Row(r, time, stamp is not None and not isinstance(stamp, str), lineno)

    rows, skipped = parse_lines(path, parse, skip_bad)
    unit, detected = _timestamp_unit(rows, path, timestamp_unit)
    scale = TIMESTAMP_UNITS[unit]
    given = [r.time * (scale if r.numeric else 1.0) for r in rows if r.time is not None]
    origin = min(given, default=0.0)
    requests, t = [], origin
    for row in rows:
        t = t if row.time is None else row.time * (scale if row.numeric else 1.0)
        requests.append(row.request.with_arrival(t - origin))
    meta = {"source": str(path), "format": "openai_chat", "role_template": ROLE_TEMPLATE,
            "generation_prompt": GENERATION_PROMPT, "default_output_len": default_output_len,
            "add_bos": add_bos, "timestamp_unit": unit, "timestamp_unit_detected": detected}
    return Workload(path.stem, requests, skipped=skipped, meta=meta)
