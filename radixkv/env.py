"""The one place environment variables are read. All use the RADIXKV_ prefix."""
from __future__ import annotations

import os


def _get(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"RADIXKV_{name}", default)


def device() -> str:
    """Torch device for the real executor: RADIXKV_DEVICE, else cuda when present, else cpu."""
    explicit = _get("DEVICE")
    if explicit:
        return explicit
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def cache_dir():
    """Where built artefacts are kept between runs (the measured timing tables):
    RADIXKV_CACHE_DIR, else $XDG_CACHE_HOME/radixkv, else ~/.cache/radixkv."""
    from pathlib import Path
    explicit = _get("CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "radixkv"


def cpu_heap() -> str:
    """What a process running a real model on the CPU does with its C heap
    (radixkv.model.host_heap): RADIXKV_CPU_HEAP=keep (the default: every allocation from the
    heap, which is never trimmed) or release (glibc's defaults: big ones mapped and unmapped
    each time, the heap's free top given back)."""
    raw = _get("CPU_HEAP") or "keep"
    if raw not in ("keep", "release"):
        raise ValueError(f"RADIXKV_CPU_HEAP={raw!r}: use keep or release")
    return raw


def fault_after_steps() -> int | None:
    """Fault injection for tests and drills: RADIXKV_FAULT_AFTER_STEPS=N makes a server's engine
    thread raise an injected RuntimeError in place of its step N+1 (after N steps; 0: the
    first), as a bug in a step would. Unset (or empty): no fault. Never set it in production."""
    raw = _get("FAULT_AFTER_STEPS")
    if not raw:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"RADIXKV_FAULT_AFTER_STEPS={raw!r} is not a whole number of steps >= 0")
    return n
