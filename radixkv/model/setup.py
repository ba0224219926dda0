"""Resolving what a real model runs on: its shape (a named config or a checkpoint directory),
the torch device and dtype, its CPU threads, and whether a KV pool fits that device's memory —
before anything is allocated. The commands that run a real model (generate, serve, calibrate,
validate) take the same flags (commands/torch_flags.py) and resolve them here, once
(`torch_target`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch

from radixkv.cache.pool import host_memory_bytes
from radixkv.model.host_heap import keep_heap
from radixkv.shapes import MODEL_CONFIGS, ModelArgs
from radixkv.argcheck import positive_int


class TorchTarget(NamedTuple):
    """A real model and what it runs on, resolved from the torch flags."""
    model: str                # a named shape or a checkpoint directory
    args: ModelArgs
    device: Any               # torch.device
    dtype: Any                # torch.dtype
    threads: int              # CPU intra-op threads

    @property
    def kv_bytes_per_token(self) -> int:
        return self.args.kv_bytes_per_token(self.dtype.itemsize)

    @property
    def weight_bytes(self) -> int:
        return weight_bytes(self.args, self.dtype)

    def check_kv_memory(self, slots: int) -> None:
        check_kv_memory(self.args, slots, self.kv_bytes_per_token, self.device, self.dtype)

    def kv_room(self, reserve: float = 0.1) -> int:
        """KV tokens the device holds beside the weights, keeping `reserve` of what is free
        (at least 4 GiB on CUDA) for a step's activations."""
        have, _ = device_memory(self.device)
        keep = max(4 << 30 if self.device.type == "cuda" else 0, int(reserve * have))
        return max(0, (have - keep - self.weight_bytes) // self.kv_bytes_per_token)

    def executor(self, slots: int, **options):
        """The TorchExecutor over a pool of `slots`, on this device, dtype and threads."""
        from radixkv.model.executor import TorchExecutor
        if self.device.type == "cpu":
            torch.set_num_threads(self.threads)
            keep_heap()
        return TorchExecutor.from_config(self.model, slots, device=self.device, dtype=self.dtype,
                                         **options)


def torch_target(model: str, device: str | None, dtype: str | None, threads: int,
                 threads_flag: str = "--threads") -> TorchTarget:
    """The model's shape, the device (RADIXKV_DEVICE, else cuda if present, else cpu, unless
    given), the dtype (float32 on a CPU, bfloat16 on CUDA, unless given) and the threads, each
    checked with a clear error, in that order."""
    from radixkv.model.executor import default_dtype
    args = model_args(model)
    threads = positive_int(threads, threads_flag)
    dev = torch_device(device)
    return TorchTarget(model, args, dev, getattr(torch, dtype) if dtype else default_dtype(dev),
                       threads)


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


def weight_bytes(margs: ModelArgs, dtype) -> int:
    """The model's parameters in `dtype`, in bytes."""
    return margs.num_params * dtype.itemsize


def check_kv_memory(margs: ModelArgs, slots: int, bytes_per_token: int, dev, dtype) -> None:
    """Refuse a KV pool the device cannot hold beside the model's weights, before anything is
    allocated."""
    need = slots * bytes_per_token
    weights = weight_bytes(margs, dtype)
    have, where = device_memory(dev)
    if need + weights > have:
        raise ValueError(f"--max-total-tokens {slots:,}: a KV pool of {slots:,} tokens at "
                         f"{bytes_per_token:,} bytes per token ({margs.name}, "
                         f"{str(dtype).removeprefix('torch.')}) needs {need / 2**30:,.1f} GiB "
                         f"beside {weights / 2**30:,.1f} GiB of weights; {where} has "
                         f"{have / 2**30:,.1f} GiB available")
