"""The C heap of a process that runs a real model on the CPU: kept, not handed back.

glibc serves an allocation over its mmap threshold (adaptive, at most 32 MiB) with a fresh
mapping and unmaps it on free, and gives the heap's free top back to the system beyond a trim
threshold. A step's activations of tens of MiB are then faulted in page by page, anew, every
step: on tiny-llama, 63 prefill segments of 32 tokens after a shared 2,000-token prefix took
365-440 ms a step with glibc's defaults (half of the process's time in the kernel), 238-255 ms
with the heap kept. The first step of each new largest size still grows the heap once.

keep_heap() makes every allocation come from the heap (M_MMAP_MAX 0) and trims it only past
2 GiB of free top (M_TRIM_THRESHOLD): pages once faulted are reused, and the process keeps the
resident memory of its largest step, much as a caching allocator does. A thread's own arena
still maps an allocation over its 64 MiB heap size. RADIXKV_CPU_HEAP=release (radixkv.env) leaves
glibc's defaults. Elsewhere than glibc nothing is changed.
"""
from __future__ import annotations

import ctypes
import ctypes.util

from radixkv import env

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4          # glibc's mallopt parameters (malloc.h)
_KEPT: bool | None = None                       # the outcome of the first call, once


def keep_heap() -> bool:
    """Keep the process's C heap (module doc), once; whether it is kept."""
    global _KEPT
    if _KEPT is None:
        _KEPT = env.cpu_heap() == "keep" and _mallopt_keep()
    return _KEPT


def _mallopt_keep() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):    # no C library by that name, or no mallopt
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success, 0 on a value it refuses
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
