"""The generator registry and the one entry point that turns a name or a path into a Workload."""
from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .chat import multiturn, support
from .prefix import burst, fewshot, rag, tree
from .record import HEADER_KEY, Workload, read_jsonl
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


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first non-blank, non-header line as a dict, or None when there is none or it is
    not a JSON object (the full reader then reports the line properly)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                return None
            if isinstance(d, dict) and HEADER_KEY in d:
                continue
            return d if isinstance(d, dict) else None
    return None


def load_workload(spec: str | Path, **kw: Any) -> Workload:
    """A generator name -> generate it with `kw` as overrides. A file path -> read it: a
    hash-id trace (Mooncake style, recognised by a `hash_ids` or `input_length` key in its
    first record) with `read_hash_id_trace(path, **kw)`, else a TraceRequest JSONL file with
    `read_jsonl(path, **kw)`."""
    if isinstance(spec, str) and spec in GENERATORS:
        return make_workload(spec, **kw)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"{str(spec)!r} is neither a workload name "
                         f"({', '.join(GENERATORS)}) nor an existing file")
    first = _first_record(path)
    reader: Callable[..., Workload] = read_jsonl
    if first is not None and ("hash_ids" in first or "input_length" in first):
        reader = read_hash_id_trace
    _check_kwargs(reader, kw, f"{reader.__name__}({str(path)!r})")
    return reader(path, **kw)
