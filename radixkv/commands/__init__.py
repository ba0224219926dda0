"""Subcommands of the `radixkv` command line; each module has `register(subparsers)`."""
