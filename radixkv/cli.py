"""`radixkv ...` (also `python -m radixkv`): one subcommand per module in radixkv/commands.

A bad input ends the command with one line on stderr, "radixkv COMMAND: error: ...", and exit
status 2; Ctrl-C with "radixkv COMMAND: interrupted" and 130. Only the errors that bad input
raises are caught here (ValueError, which covers UnicodeDecodeError, and OSError, which
covers a missing file): anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import sys
from importlib import import_module

from radixkv import __version__

COMMANDS = ("compare", "simulate", "replay", "generate", "sweep", "serve", "bench-serve",
            "four-way", "calibrate", "validate", "cluster", "plan", "tokenizer", "route")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) like every other error here."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="radixkv",
        description="Prefix-aware KV-cache manager and scheduler: replay traffic, compare "
                    "cache designs, simulate and run an engine.")
    parser.add_argument("--version", action="version", version=f"radixkv {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        import_module(f"radixkv.commands.{name.replace('-', '_')}").register(sub)
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return _one_line(str(e)) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    where = f"radixkv {args.command}"
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:
        print(f"{where}: error: {_message(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
