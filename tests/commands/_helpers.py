"""Shared helpers for the command-line tests: run `radixkv` in-process, write small traces."""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.cli import build_parser, main

# small enough that a simulated run takes well under a second
SMALL = ["--limit", "40"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `radixkv ARGV`."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def parse(*argv: str):
    return build_parser().parse_args([str(a) for a in argv])


def write_lines(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def hash_id_trace(path: Path) -> Path:
    """Four requests of a hash-id trace in 64-token blocks; the first three share blocks 0, 1."""
    return write_lines(path, [
        {"timestamp": 0, "input_length": 130, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 500, "input_length": 150, "output_length": 5, "hash_ids": [0, 1, 3]},
        {"timestamp": 1000, "input_length": 128, "output_length": 2, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 40, "output_length": 2, "hash_ids": [9]},
    ])
