"""`--router-option ROUTER.FIELD=VALUE`: a router's tunables from the command line. Each value is
set on the router's own Options (a frozen dataclass that validates itself), read as the type of
the field's default (a bool as true/false/1/0/yes/no), on top of the router's defaults
(`Router.default_options`). A router not named by --router, a field its Options lacks, a value
that does not read as its type or that the Options refuses: one error naming it, before any run.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from radixkv.router.base import ROUTERS

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _read(text: str, like: Any, spec: str) -> Any:
    try:
        if isinstance(like, bool):
            return _BOOLS[text.strip().lower()]
        if isinstance(like, int):
            return int(text)
        if isinstance(like, float):
            return float(text)
    except (KeyError, ValueError):
        kind = "true or false" if isinstance(like, bool) else f"a {type(like).__name__}"
        raise ValueError(f"--router-option {spec!r}: {text!r} is not {kind}") from None
    return text


def parse_router_options(specs: Sequence[str], routers: Sequence[str]) -> dict[str, Any]:
    """router name -> its Options with the fields `specs` set (routers not set are absent)."""
    changes: dict[str, dict[str, Any]] = {}
    bases: dict[str, Any] = {}                # each named router's defaults
    for spec in specs:
        key, eq, text = spec.partition("=")
        name, dot, field = key.strip().rpartition(".")
        if not (eq and dot and name and field):
            raise ValueError(f"--router-option {spec!r}: expected ROUTER.FIELD=VALUE")
        if name not in routers:
            raise ValueError(f"--router-option {spec!r}: router {name!r} is not among --router "
                             f"({', '.join(routers)})")
        base = bases.setdefault(name, ROUTERS.get(name).default_options())
        if base is None:
            raise ValueError(f"--router-option {spec!r}: router {name!r} takes no options")
        fields = [f.name for f in dataclasses.fields(base)]
        if field not in fields:
            raise ValueError(f"--router-option {spec!r}: router {name!r} has no option "
                             f"{field!r}; its options: {', '.join(fields)}")
        if field in changes.get(name, {}):
            raise ValueError(f"--router-option {spec!r}: {name}.{field} is set twice")
        changes.setdefault(name, {})[field] = _read(text, getattr(base, field), spec)
    out = {}
    for name, kw in changes.items():
        try:
            out[name] = dataclasses.replace(bases[name], **kw)
            ROUTERS.get(name).check_options(out[name])
        except ValueError as e:
            raise ValueError(f"--router-option: {e}") from None
    return out
