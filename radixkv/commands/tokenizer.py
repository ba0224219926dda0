"""`radixkv tokenizer DIR`: the tokenizer `radixkv serve` uses for a named model, written as a
Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json with the chat template,
special_tokens_map.json), for the benchmark clients and routers that load one by path. A
checkpoint directory's own tokenizer files are copied as they are."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from radixkv.commands.output import console
from radixkv.shapes import MODEL_CONFIGS

CHECKPOINT_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "tokenizer", help="write the served model's tokenizer as a Hugging Face directory",
        description="Write the tokenizer `radixkv serve --model NAME` encodes and decodes with "
                    "as a Hugging Face tokenizer directory: for a named model, the built-in byte "
                    "tokenizer (UTF-8 bytes are ids 0-255, <bos> <eos> <pad> 256-258, reserved "
                    "ids up to the model's vocabulary) with the server's chat template; for a "
                    "checkpoint directory, its own tokenizer files.")
    p.add_argument("dir", type=Path, metavar="DIR", help="the directory to write (created)")
    p.add_argument("--model", default="tiny-llama", metavar="NAME|DIR",
                   help=f"a named model ({', '.join(MODEL_CONFIGS)}) or a checkpoint directory "
                        f"(default: tiny-llama)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out: Path = args.dir
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} exists and is not a directory")
    if args.model in MODEL_CONFIGS:
        from radixkv.model.tokenizer_files import write_tokenizer_dir
        m = MODEL_CONFIGS[args.model]
        write_tokenizer_dir(out, m.vocab_size, m.max_seq_len)
        what = f"byte tokenizer, vocabulary {m.vocab_size:,}, context {m.max_seq_len:,}"
    elif Path(args.model).is_dir():
        src = Path(args.model)
        if not (src / "tokenizer.json").is_file():
            raise ValueError(f"checkpoint {src} has no tokenizer.json: the server would use "
                             f"bytes; export a named model instead")
        out.mkdir(parents=True, exist_ok=True)
        for name in CHECKPOINT_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, out / name)
        what = f"the tokenizer files of {src}"
    else:
        raise ValueError(f"unknown model {args.model!r}: not a named model "
                         f"({', '.join(MODEL_CONFIGS)}) nor a checkpoint directory")
    console().print(f"wrote {out} ({what})", highlight=False)
    return 0
