"""The peers' own tools that the interop tests drive, pinned, each in a venv of its own under
`.interop/` at the repository root (ignored by git; `make interop` installs what is missing and
keeps what is there). torch is held at the project's pin for any tool that pulls it."""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / ".interop"
CONSTRAINTS = ("torch==2.13.0",)


class Peer(NamedTuple):
    requirement: str      # what pip installs
    program: str          # the console script the tests run


PEERS = {
    "vllm-router": Peer("vllm-router==0.1.17", "vllm-router"),
    "sglang-router": Peer("sglang-router==0.3.2", "smg"),
    "aiperf": Peer("aiperf==0.13.0", "aiperf"),
    "guidellm": Peer("guidellm==0.8.1", "guidellm"),
}


def program(name: str) -> Path:
    return HOME / name / "bin" / PEERS[name].program


def installed(name: str) -> bool:
    stamp = HOME / name / ".installed"
    return stamp.is_file() and stamp.read_text() == PEERS[name].requirement and \
        program(name).is_file()
