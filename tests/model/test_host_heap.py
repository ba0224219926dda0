"""radixkv.model.host_heap: a process that keeps its C heap serves a 64 MiB allocation from the
heap, one that releases it (RADIXKV_CPU_HEAP=release, glibc's defaults) maps it; each checked in
a fresh interpreter, as mallopt is process-wide."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest

from radixkv import env

libc_name = ctypes.util.find_library("c")
if not libc_name or not hasattr(ctypes.CDLL(libc_name), "mallinfo2"):
    pytest.skip("needs glibc's mallinfo2", allow_module_level=True)

PROBE = """
import ctypes, ctypes.util
import numpy as np
from radixkv.model.host_heap import keep_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
kept = keep_heap()
assert keep_heap() == kept                   # once: the second call reports the first's outcome
before = libc.mallinfo2()
a = np.ones(64 << 20, dtype=np.uint8)        # through malloc
during = libc.mallinfo2()
del a
after = libc.mallinfo2()
print(kept, during.hblkhd - before.hblkhd, during.uordblks - before.uordblks,
      during.arena - after.arena)
"""


def probe(heap: str | None) -> tuple[str, int, int, int]:
    """(kept, bytes newly mapped, bytes newly in use in the heap, bytes the free trimmed)."""
    e = {k: v for k, v in os.environ.items() if k != "RADIXKV_CPU_HEAP"}
    if heap is not None:
        e["RADIXKV_CPU_HEAP"] = heap
    out = subprocess.run([sys.executable, "-c", PROBE], env=e, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    return out[0], int(out[1]), int(out[2]), int(out[3])


def test_kept_heap_serves_a_big_allocation_from_the_heap_and_keeps_it():
    kept, mapped, in_heap, trimmed = probe(None)
    assert kept == "True"
    assert mapped == 0                      # no mapping for it: ...
    assert in_heap >= 64 << 20              # ... it is in the heap's blocks,
    assert trimmed == 0                     # and the heap keeps its pages after the free


def test_released_heap_maps_a_big_allocation():
    kept, mapped, in_heap, _ = probe("release")
    assert kept == "False"
    assert mapped >= 64 << 20 and in_heap < 1 << 20


def test_bad_setting_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("RADIXKV_CPU_HEAP", "forever")
    with pytest.raises(ValueError, match="RADIXKV_CPU_HEAP='forever': use keep or release"):
        env.cpu_heap()
    monkeypatch.delenv("RADIXKV_CPU_HEAP")
    assert env.cpu_heap() == "keep"


def test_a_real_model_on_the_cpu_keeps_the_heap(monkeypatch):
    pytest.importorskip("torch")
    from radixkv.model import host_heap
    from radixkv.model.setup import torch_target
    monkeypatch.delenv("RADIXKV_CPU_HEAP", raising=False)
    monkeypatch.setattr(host_heap, "_KEPT", None)
    torch_target("tiny-llama", "cpu", None, 1).executor(64)
    assert host_heap._KEPT is True
