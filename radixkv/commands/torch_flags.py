"""The real model's flags, defined once for every command that runs it (generate, calibrate,
validate, serve): --device, --dtype and --threads. A command adds the ones it takes, in its own
order; `scope` prefixes the help where another executor exists ("torch: " in serve). What the
values resolve to is radixkv.model.setup.torch_target's business."""
from __future__ import annotations

from typing import Any

DTYPES = ("bfloat16", "float16", "float32")
DEVICE_DEFAULT = "RADIXKV_DEVICE, else cuda if present, else cpu"


def add_torch_flag(group: Any, flag: str, *, scope: str = "", default: str | None = None) -> None:
    """Add one of the torch flags to `group`; `default` words the default where a command's
    differs from the flag's own (--device: where it comes from; --threads: a note after 1)."""
    if flag == "--device":
        group.add_argument("--device", help=f"{scope}cpu, cuda or cuda:N (default: "
                                            f"{default or DEVICE_DEFAULT})")
    elif flag == "--dtype":
        names = f"{', '.join(DTYPES[:-1])} or {DTYPES[-1]}" if scope else ", ".join(DTYPES)
        group.add_argument("--dtype", choices=DTYPES, metavar="NAME",
                           help=f"{scope}{names} (default: float32 on CPU, bfloat16 on CUDA)")
    elif flag == "--threads":
        what = f"{scope.removesuffix(': ')} on the CPU: intra-op" if scope else "CPU intra-op"
        group.add_argument("--threads", type=int, default=1, metavar="N",
                           help=f"{what} threads (default: 1{default or ''})")
    else:
        raise ValueError(f"unknown torch flag {flag!r}; valid: --device, --dtype, --threads")
