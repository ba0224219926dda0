"""The request record, the Workload container, and the JSONL trace format.

A JSONL trace holds one `TraceRequest.to_json()` object per line. `write_jsonl` puts an
optional header line first (``{"radixkv_workload": 1, "name": ..., "block_size": ...,
"meta": {...}}``) so that a round trip keeps the workload's name and generator parameters;
`read_jsonl` accepts files with or without it. Blank lines are ignored.

Size bounds, shared by every reader and generator: token ids lie in [0, 2**32) (the cache
packs them as uint32); a request holds at most `MAX_REQUEST_TOKENS` = 2**24 prompt + output
tokens (more than any model's context); a generated or expanded workload at most
`MAX_WORKLOAD_TOKENS` = 2**31 tokens and `MAX_WORKLOAD_REQUESTS` = 2**24 requests.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from radixkv.argcheck import (an_int, finite_at_least, finite_time, int_at_least, is_number,
                              optional_str, positive_int, positive_number)

HEADER_KEY = "radixkv_workload"
HEADER_VERSION = 1

TOKEN_ID_LIMIT = 2**32
MAX_REQUEST_TOKENS = 2**24
MAX_WORKLOAD_TOKENS = 2**31
MAX_WORKLOAD_REQUESTS = 2**24

T = TypeVar("T")


class TraceFormatError(ValueError):
    """A trace file line that cannot be read: "<file>:<line>: <reason>; <hint>", the line
    1-based; `path`, `lineno` and `reason` are kept so that a command line can name its own
    flag in the hint (`with_hint`)."""

    def __init__(self, path: str | Path, lineno: int, reason: str,
                 hint: str = "skip_bad=True skips such lines") -> None:
        self.path, self.lineno, self.reason, self.hint = str(path), lineno, reason, hint
        super().__init__(f"{path}:{lineno}: {reason}; {hint}")

    def with_hint(self, hint: str) -> TraceFormatError:
        """The same error with another hint ("--skip-bad skips such lines")."""
        return TraceFormatError(self.path, self.lineno, self.reason, hint)


def json_line(line: str) -> Any:
    """One line's JSON value; a ValueError that says what broke and where, in place of the
    decoder's own "Expecting ',' delimiter: line 1 column 45 (char 44)"."""
    line = line.rstrip()
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        cut = "; the line looks cut short" if e.pos >= len(line) or \
            e.msg.startswith("Unterminated") else ""
        raise ValueError(f"not valid JSON ({e.msg}, column {e.colno}{cut})") from None


def _as_tokens(name: str, value: Any) -> tuple[int, ...]:
    """Validate a token sequence and return it as a tuple of plain ints."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or (value.size and value.dtype.kind not in "iu"):
            raise ValueError(f"{name} must be a 1-D integer array, got dtype {value.dtype} "
                             f"shape {value.shape}")
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        raise ValueError(f"{name} must be a sequence of token ids, got {type(value).__name__}")
    toks = tuple(value)
    # One pass over the element types in C beats a per-token isinstance loop by ~5x;
    # bool is rejected on purpose even though it subclasses int.
    kinds = set(map(type, toks))
    if not kinds <= {int}:
        bad = next(t for t in toks if type(t) is not int)
        raise ValueError(f"{name} must hold int token ids, found {bad!r} "
                         f"({type(bad).__name__})")
    if toks and min(toks) < 0:
        raise ValueError(f"{name} holds a negative token id {min(toks)}")
    if toks and max(toks) >= TOKEN_ID_LIMIT:
        raise ValueError(f"{name} holds token id {max(toks)}, outside [0, 2**32)")
    return toks


def token_count(v: Any, what: str, lo: int = 0) -> int:
    """A per-request token count: an int in [lo, MAX_REQUEST_TOKENS]."""
    n = int_at_least(v, what, lo)
    if n > MAX_REQUEST_TOKENS:
        raise ValueError(f"{what} {n:,} is over the bound of {MAX_REQUEST_TOKENS:,} (2**24) "
                         f"tokens per request")
    return n


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a workload.

    `output` holds the exact reply token ids when the workload knows them (multi-turn
    generators re-send them in the next turn); `output_len` is then `len(output)` and may
    be omitted. With `output=None`, `output_len` is required. Lists and 1-D integer numpy
    arrays are accepted for the token fields and stored as tuples of ints.
    """

    id: str
    arrival: float
    prompt: tuple[int, ...]
    output: tuple[int, ...] | None = None
    output_len: int | None = None  # always an int after construction
    extra_key: str | None = None
    cache_salt: str | None = None
    priority: int = 0
    routing_key: str | None = None
    session: str | None = None
    pin_ttl: float = 0.0           # > 0: pin the prompt's KV for this many seconds once cached

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"id must be a non-empty str, got {self.id!r}")
        object.__setattr__(self, "arrival", finite_time(self.arrival, "arrival"))
        prompt = _as_tokens("prompt", self.prompt)
        if not prompt:
            raise ValueError(f"prompt of request {self.id!r} is empty")
        object.__setattr__(self, "prompt", prompt)
        n = self.output_len
        if n is not None:
            n = token_count(n, "output_len")
            object.__setattr__(self, "output_len", n)
        if self.output is not None:
            output = _as_tokens("output", self.output)
            if n is not None and n != len(output):
                raise ValueError(f"output_len {n} != len(output) {len(output)} "
                                 f"in request {self.id!r}")
            object.__setattr__(self, "output", output)
            object.__setattr__(self, "output_len", len(output))
        elif n is None:
            raise ValueError(f"output_len is required when output is None "
                             f"(request {self.id!r})")
        token_count(len(prompt) + self.output_len,
                    f"request {self.id!r}: prompt + output length")
        object.__setattr__(self, "priority", an_int(self.priority, "priority"))
        object.__setattr__(self, "pin_ttl", finite_at_least(self.pin_ttl, "pin_ttl", 0))
        for name in ("extra_key", "cache_salt", "routing_key", "session"):
            optional_str(getattr(self, name), name)

    @classmethod
    def unchecked(cls, id: str, arrival: float, prompt: tuple[int, ...],
                  output: tuple[int, ...] | None, output_len: int,
                  session: str | None = None) -> TraceRequest:
        """Build without validation, for readers whose token ids are valid by construction.

        Validating every token of a 60M-token trace costs as much as expanding it.
        """
        obj = object.__new__(cls)
        for name, value in (("id", id), ("arrival", float(arrival)), ("prompt", prompt),
                            ("output", output), ("output_len", output_len),
                            ("extra_key", None), ("cache_salt", None), ("priority", 0),
                            ("routing_key", None), ("session", session), ("pin_ttl", 0.0)):
            object.__setattr__(obj, name, value)
        return obj

    def with_arrival(self, arrival: float) -> TraceRequest:
        """A copy arriving at `arrival`; the token fields, already valid, are not re-checked."""
        obj = object.__new__(TraceRequest)
        for name in _FIELD_NAMES:
            object.__setattr__(obj, name, getattr(self, name))
        object.__setattr__(obj, "arrival", finite_time(arrival, "arrival"))
        return obj

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; optional fields appear only when set."""
        d: dict[str, Any] = {
            "id": self.id, "arrival": self.arrival, "prompt": list(self.prompt),
            "output": None if self.output is None else list(self.output),
            "output_len": self.output_len,
        }
        for name in _OPTIONAL:
            v = getattr(self, name)
            if v != _DEFAULTS[name]:
                d[name] = v
        return d

    @classmethod
    def from_json(cls, d: Any) -> TraceRequest:
        """Inverse of `to_json`; raises ValueError naming a missing, unknown or bad field."""
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        for key in ("id", "arrival", "prompt"):
            if key not in d:
                raise ValueError(f"missing field {key!r}")
        unknown = sorted(set(d) - _FIELD_NAMES)
        if unknown:
            raise ValueError(f"unknown field {unknown[0]!r}")
        for key in ("prompt", "output"):
            if d.get(key) is not None and not isinstance(d[key], list):
                raise ValueError(f"{key} must be a JSON list, got {type(d[key]).__name__}")
        return cls(**d)


_FIELD_NAMES = frozenset(f.name for f in fields(TraceRequest))
_OPTIONAL = ("extra_key", "cache_salt", "priority", "routing_key", "session", "pin_ttl")
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(TraceRequest)}


@dataclass
class Workload:
    """A named list of requests, sorted by arrival (stable: equal arrivals keep their order).

    `block_size` is set for traces built from block hash ids; `meta` holds the generator
    parameters (JSON types only) or the trace source; `skipped` counts malformed lines
    dropped by a reader with skip_bad=True.
    """

    name: str
    requests: list[TraceRequest]
    skipped: int = 0
    block_size: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.requests = sorted(self.requests, key=lambda r: r.arrival)
        seen: set[str] = set()
        for r in self.requests:
            if r.id in seen:
                raise ValueError(f"duplicate request id {r.id!r} in workload {self.name!r}")
            seen.add(r.id)

    def __repr__(self) -> str:
        # The default repr would print every token of every request.
        return (f"Workload(name={self.name!r}, requests={len(self.requests)}, "
                f"prompt_tokens={self.num_prompt_tokens}, skipped={self.skipped}, "
                f"block_size={self.block_size})")

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[TraceRequest]:
        return iter(self.requests)

    def __getitem__(self, i: int) -> TraceRequest:
        return self.requests[i]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(r.prompt) for r in self.requests)

    @property
    def num_output_tokens(self) -> int:
        return sum(r.output_len for r in self.requests)

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival (0 for an offline workload)."""
        return self.requests[-1].arrival - self.requests[0].arrival if self.requests else 0.0

    def scaled(self, factor: float) -> Workload:
        """Every arrival multiplied by `factor` (finite, > 0): 0.5 replays the same requests
        in half the time, i.e. at twice the load. Order is kept; `meta["time_scale"]` holds
        the product of all factors applied so far."""
        factor = positive_number(factor, "time scale factor")
        last = self.requests[-1].arrival if self.requests else 0.0
        if not math.isfinite(last * factor):
            raise ValueError(f"time scale factor {factor!r} takes the last arrival "
                             f"{last!r} s past the float range")
        prev = self.meta.get("time_scale")
        meta = {**self.meta, "time_scale": (prev if is_number(prev) else 1.0) * factor}
        return Workload(self.name, [r.with_arrival(r.arrival * factor) for r in self.requests],
                        skipped=self.skipped, block_size=self.block_size, meta=meta)


def write_jsonl(workload: Workload, path: str | Path, header: bool = True) -> None:
    """Write one request per line, preceded by a header line unless header=False."""
    with open(path, "w", encoding="utf-8") as f:
        if header:
            f.write(json.dumps({HEADER_KEY: HEADER_VERSION, "name": workload.name,
                                "block_size": workload.block_size,
                                "meta": workload.meta}) + "\n")
        for r in workload.requests:
            f.write(json.dumps(r.to_json(), separators=(",", ":")) + "\n")


def _parse_header(d: dict[str, Any]) -> tuple[str | None, int | None, dict[str, Any]]:
    if d.get(HEADER_KEY) != HEADER_VERSION:
        raise ValueError(f"unsupported header version {d.get(HEADER_KEY)!r}")
    name, bs, meta = d.get("name"), d.get("block_size"), d.get("meta", {})
    optional_str(name, "header name")
    if bs is not None:
        positive_int(bs, "header block_size")
    if not isinstance(meta, dict):
        raise ValueError(f"header meta must be an object, got {type(meta).__name__}")
    return name, bs, meta


def decode_line(raw: bytes, lineno: int) -> str:
    """One line of a trace file as text; ValueError saying where the UTF-8 breaks."""
    try:
        # utf-8-sig drops the byte-order mark some editors put at the start of a file
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        hint = " (the file looks like UTF-16: convert it to UTF-8)" \
            if lineno == 1 and raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ValueError(f"not UTF-8 text: byte 0x{raw[e.start]:02x} at column "
                         f"{e.start + 1}{hint}") from None


def parse_lines(path: str | Path, parse: Callable[[str, int], T | None],
                skip_bad: bool = False, limit: int | None = None) -> tuple[list[T], int]:
    """Apply `parse(text, lineno)` to each non-blank line: (results that are not None,
    skipped lines). A line whose decoding or parsing raises ValueError or TypeError raises
    TraceFormatError("<file>:<line>: <what>; ..."), or with skip_bad=True is counted and
    dropped. `limit` stops after that many results."""
    out: list[T] = []
    skipped = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if limit is not None and len(out) >= limit:
                break
            try:
                line = decode_line(raw, lineno)
                if not line.strip():
                    continue
                item = parse(line, lineno)
            except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
                if not skip_bad:
                    raise TraceFormatError(path, lineno, str(e)) from None
                skipped += 1
                continue
            if item is not None:
                out.append(item)
    return out, skipped


def read_jsonl(path: str | Path, skip_bad: bool = False) -> Workload:
    """Read a JSONL trace of TraceRequest objects.

    A malformed line raises TraceFormatError("<file>:<line>: <what>"); with skip_bad=True
    it is dropped and counted in `Workload.skipped` instead. Duplicate ids count as
    malformed (the later line is the bad one). `meta` is the header's, unchanged, so a
    write/read round trip is exact; `load_workload` adds `source` when it is missing.
    """
    path = Path(path)
    ids: set[str] = set()
    header: dict[str, Any] = {}

    def parse(line: str, lineno: int) -> TraceRequest | None:
        d = json_line(line)
        if lineno == 1 and isinstance(d, dict) and HEADER_KEY in d:
            header["name"], header["block_size"], header["meta"] = _parse_header(d)
            return None
        r = TraceRequest.from_json(d)
        if r.id in ids:
            raise ValueError(f"duplicate request id {r.id!r}")
        ids.add(r.id)
        return r

    requests, skipped = parse_lines(path, parse, skip_bad)
    return Workload(header.get("name") or path.stem, requests, skipped=skipped,
                    block_size=header.get("block_size"), meta=header.get("meta", {}))
