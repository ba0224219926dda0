"""Resolving what a real model runs on: its shape (a named config or a checkpoint directory),
the torch device, and whether a KV pool fits that device's memory — before anything is
allocated. The commands that run a real model (generate, serve, calibrate, validate) share
these."""
from __future__ import annotations

from pathlib import Path

import torch

from radixkv.cache.pool import host_memory_bytes
from radixkv.shapes import MODEL_CONFIGS, ModelArgs


def model_args(name: str) -> ModelArgs:
    if name in MODEL_CONFIGS:
        return MODEL_CONFIGS[name]
    if not Path(name).is_dir():
        raise ValueError(f"unknown model {name!r}: not a named shape ({', '.join(MODEL_CONFIGS)}) "
                         f"nor a checkpoint directory")
    from radixkv.model.weights import args_from_hf_config, read_hf_config
    return args_from_hf_config(read_hf_config(name), where=f"{name}/config.json")


def torch_device(text: str | None):
    """The torch device to run on; a clear error for one torch does not know or cannot use."""
    from radixkv import env
    from radixkv.model.executor import resolve_device
    try:
        dev = resolve_device(text)
    except RuntimeError:                      # torch's own "Expected one of cpu, cuda, ..."
        raise ValueError(f"device {text or env.device()!r} is not a torch device: cpu, cuda "
                         f"or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(dev)!r}: models run on cpu or cuda")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {str(dev)!r}: there are {torch.cuda.device_count()} CUDA devices")
    return dev


def device_memory(dev) -> tuple[int, str]:
    """(bytes a new allocation can still get on `dev`, its name)."""
    if dev.type == "cuda":
        return torch.cuda.mem_get_info(dev)[0], f"{torch.cuda.get_device_name(dev)} ({dev})"
    return host_memory_bytes(), "this machine"


def device_name(dev) -> str:
    """"cpu", or the CUDA device's name."""
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type


def check_kv_memory(margs: ModelArgs, slots: int, bytes_per_token: int, dev, dtype) -> None:
    """Refuse a KV pool the device cannot hold, before anything is allocated."""
    need = slots * bytes_per_token
    have, where = device_memory(dev)
    if need > have:
        raise ValueError(f"--max-total-tokens {slots:,}: a KV pool of {slots:,} tokens at "
                         f"{bytes_per_token:,} bytes per token ({margs.name}, "
                         f"{str(dtype).removeprefix('torch.')}) needs {need / 2**30:,.1f} GiB; "
                         f"{where} has {have / 2**30:,.1f} GiB available")
