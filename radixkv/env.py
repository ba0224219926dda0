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
