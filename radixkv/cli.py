"""`radixkv ...` (also `python -m radixkv`): one subcommand per module in radixkv/commands."""
from __future__ import annotations

import argparse
import sys
from importlib import import_module

COMMANDS = ("compare", "simulate", "replay", "generate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixkv",
        description="Prefix-aware KV-cache manager and scheduler: replay traffic, compare "
                    "cache designs, simulate and run an engine.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        import_module(f"radixkv.commands.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"radixkv {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
