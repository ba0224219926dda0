"""The generator registry and the one entry point that turns a name or a path into a Workload."""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from .chat import multiturn, support
from .chatlog import read_chat_log
from .prefix import burst, fewshot, rag, tree
from .record import HEADER_KEY, Workload, decode_line, read_jsonl
from .traces import read_hash_id_trace

GENERATORS: dict[str, Callable[..., Workload]] = {
    "support": support,
    "fewshot": fewshot,
    "multiturn": multiturn,
    "burst": burst,
    "tree": tree,
    "rag": rag,
}


def _check_kwargs(fn: Callable[..., Any], kw: dict[str, Any], what: str) -> None:
    params = [p for p in inspect.signature(fn).parameters if p != "path"]
    for key in kw:
        if key not in params:
            raise ValueError(f"unknown parameter {key!r} for {what}; "
                             f"valid: {', '.join(params)}")


def make_workload(name: str, **overrides: Any) -> Workload:
    """Run the generator `name` with its defaults, replaced by `overrides`."""
    fn = GENERATORS.get(name)
    if fn is None:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(GENERATORS)}")
    _check_kwargs(fn, overrides, f"workload {name!r}")
    return fn(**overrides)


TraceKind = Literal["jsonl", "hash_ids", "openai_chat", "empty"]
KIND_NAMES: dict[str, str] = {
    "jsonl": "radixkv JSONL trace", "hash_ids": "hash-id trace",
    "openai_chat": "OpenAI chat log", "empty": "file with no records",
}
READERS: dict[str, Callable[..., Workload]] = {
    "jsonl": read_jsonl, "hash_ids": read_hash_id_trace, "openai_chat": read_chat_log,
}


def trace_format(path: str | Path) -> TraceKind:
    """The kind of trace file, from its first line that is a JSON object (the radixkv header
    excepted): "openai_chat" if it has `messages`, "hash_ids" if it has `hash_ids` or
    `input_length`, else "jsonl". Lines that are not JSON objects are passed over (the
    reader reports them); "empty" when no line is anything but blank or the header."""
    saw_line = False
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                d = json.loads(decode_line(raw, lineno))
            except ValueError:
                saw_line = True
                continue
            if lineno == 1 and isinstance(d, dict) and HEADER_KEY in d:
                continue
            saw_line = True
            if not isinstance(d, dict):
                continue
            if "messages" in d:
                return "openai_chat"
            if "hash_ids" in d or "input_length" in d:
                return "hash_ids"
            return "jsonl"
    return "jsonl" if saw_line else "empty"


# Options that select a reader: None means not given, so a command line can pass them as is.
_KIND_OPTIONS = {"block_size": ("hash_ids", "hash-id traces"),
                 "tokenizer": ("openai_chat", "OpenAI chat logs")}


def load_workload(spec: str | Path, **kw: Any) -> Workload:
    """A generator name -> generate it with `kw` as overrides. A file path -> read it with
    the reader for its `trace_format`: `read_hash_id_trace(path, **kw)` (block_size,
    skip_bad, vocab_size, limit), `read_chat_log(path, **kw)` (tokenizer, required;
    skip_bad, default_output_len, add_bos) or `read_jsonl(path, **kw)` (skip_bad). A file
    with no records gives an empty Workload (its header's name and meta, if any).

    block_size and tokenizer given as None count as not given; given for another kind of
    workload they raise ValueError. `meta["source"]` is set to the path when the workload
    does not name its source already (a radixkv JSONL header keeps the one it was written
    with; generators set "generator:NAME")."""
    kw = {k: v for k, v in kw.items() if not (k in _KIND_OPTIONS and v is None)}
    if isinstance(spec, str) and spec in GENERATORS:
        for key, (_, kinds) in _KIND_OPTIONS.items():
            if key in kw:
                raise ValueError(f"{key} applies to {kinds} only, not to the generator "
                                 f"{spec!r}")
        return make_workload(spec, **kw)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{str(spec)!r} is neither a workload name "
                         f"({', '.join(GENERATORS)}) nor an existing file")
    kind = trace_format(path)
    if kind == "empty":
        # No record, no kind: any reader's option is accepted, a misspelt one still is not.
        valid = [p for r in READERS.values() for p in inspect.signature(r).parameters
                 if p != "path"]
        for key in kw:
            if key not in valid:
                raise ValueError(f"unknown parameter {key!r} for the trace {str(path)!r}; "
                                 f"valid: {', '.join(dict.fromkeys(valid))}")
        w = read_jsonl(path, skip_bad=kw.get("skip_bad", False))
    else:
        for key, (owner, kinds) in _KIND_OPTIONS.items():
            if key in kw and kind != owner:
                raise ValueError(f"{path}: {key} applies to {kinds} only; this file is a "
                                 f"{KIND_NAMES[kind]}")
        if kind == "openai_chat" and "tokenizer" not in kw:
            raise ValueError(f"{path} is an OpenAI chat log: give a tokenizer "
                             f"(--tokenizer tokenizer.json)")
        reader = READERS[kind]
        _check_kwargs(reader, kw, f"{reader.__name__}({str(path)!r})")
        w = reader(path, **kw)
    w.meta.setdefault("source", str(path))
    return w
