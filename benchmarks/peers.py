"""`python benchmarks/peers.py [NAME ...]`: install the peers the speed benchmarks measure
radixkv beside, each in a venv of its own under `.peers/` (ignored by git, kept between runs),
pinned as `../shared/peers/` records them. None of them is a dependency of radixkv; a benchmark
whose peer is absent skips that row and says so.

- sglang:  SGLang 0.5.23 without its CUDA dependencies: its radix trees (`UnifiedRadixCache`
           with the Rust core) on the CPU torch
- vllm:    vLLM 0.33.0's KVCacheManager (automatic prefix caching) on the CPU torch
- dynosim: NVIDIA Dynamo's simulator (`aisimulate`) with the Dynamo stack (round robin and
           Dynamo's KV router)
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".peers"
TORCH = "torch==2.13.0"     # the project's pin: an unpinned torch pulls a multi-GB CUDA build

# each step is one `pip install` of these arguments, in order
RECIPES: dict[str, list[list[str]]] = {
    "sglang": [
        ["--no-deps", "sglang==0.5.23"],
        [TORCH, "numpy"],
        ["--no-deps", "triton==3.9.0"],                # imported at top level, works on CPU
        [TORCH, "orjson", "psutil", "pybase64", "requests", "packaging", "pillow", "starlette",
         "msgspec", "pydantic", "pyzmq", "tqdm", "ipython", "aiohttp", "transformers", "dill",
         "apache-tvm-ffi", "sentencepiece", "compressed-tensors", "gguf", "openai",
         "partial-json-parser"],
    ],
    "vllm": [
        ["--no-deps", "vllm==0.33.0"],
        [TORCH, "numpy"],
        ["packaging", "pydantic", "regex", "cbor2", "psutil", "pyzmq", "urllib3"],
        ["transformers>=5.16.1,<5.21.0"],
        ["aiohttp", "requests", "oss-harmony"],
        ["openai>=2.25.0", "pillow>=13.0.0", "pybase64", "cachetools", "msgspec", "cloudpickle",
         "uvloop", "py-cpuinfo", "prometheus_client>=0.18.0"],
        ["--no-deps", "xgrammar==0.2.8"],
        ["apache-tvm-ffi==0.1.11"],
        ["fastapi>=0.133.0,<0.137.0", "partial-json-parser", "llguidance>=1.7.0,<1.8.0", "xxhash"],
    ],
    "dynosim": [
        ["aisimulate==0.13.0.dev202610130000000070", "ai-dynamo-runtime==1.6.1",
         "pydantic<=2.13.5"],
        ["--no-deps", "ai-dynamo==1.6.1"],
        ["aiohttp", "msgspec", "prometheus-client", "pyzmq", "tqdm", "transformers",
         "zstandard"],
    ],
}


def stamp(name: str) -> str:
    return repr(RECIPES[name])


def installed(name: str) -> bool:
    s = HOME / name / ".installed"
    return s.is_file() and s.read_text() == stamp(name)


def install(name: str) -> None:
    venv = HOME / name
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    for args in RECIPES[name]:
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", *args], check=True)
    (venv / ".installed").write_text(stamp(name))


def main(names: list[str]) -> int:
    unknown = sorted(set(names) - set(RECIPES))
    if unknown:
        print(f"peers.py: unknown peer {unknown[0]!r}; valid: {', '.join(RECIPES)}",
              file=sys.stderr)
        return 2
    for name in names or list(RECIPES):
        if installed(name):
            print(f"{name}: installed")
            continue
        t0 = time.monotonic()
        install(name)
        print(f"{name}: installed in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
