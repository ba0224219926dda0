"""Block-hash-id traces (the Mooncake FAST'25 format) and the block-level reuse bound.

Format: one JSON object per line with `timestamp` (ms from trace start), `input_length`,
`output_length` (tokens) and `hash_ids`. Each id stands for one `block_size`-token block
and, the ids being chained, for everything before it too; the last block may be partial,
so len(hash_ids) == ceil(input_length / block_size). Other keys are ignored. Mooncake's
block is 512 tokens; other producers pick their own, given here as `block_size`.

Expansion to token ids. Hash id h becomes the run
    token[j] = splitmix64(splitmix64(h ^ PROMPT_SALT) + j) mod vocab_size,  j < block_size
a pure function of (h, block_size, vocab_size): equal ids give equal runs in any file;
distinct ids get distinct run seeds (splitmix64 is a bijection on 64-bit words), hence
different runs with overwhelming probability. The last block is cut to the remaining input
length (token j of a run does not depend on the run's length, so a cut run is a prefix of the
full one).

Sizes are checked per line before anything is expanded: input_length >= 1 and
input_length + output_length <= MAX_REQUEST_TOKENS (2**24); the whole trace at most
MAX_WORKLOAD_TOKENS (2**31) tokens after expansion.

Outputs are explicit token ids of length `output_length`, derived the same way from
(OUTPUT_SALT, line number): unique per request, so a replay that inserts prompt + output
creates no sharing the trace does not have. The trace carries no token text, so they cannot
reproduce what a conversation's next turn re-sends; its reuse is all in the hash ids.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from radixkv.argcheck import finite_at_least, int_at_least, positive_int

from ._common import check_vocab
from .record import (MAX_REQUEST_TOKENS, MAX_WORKLOAD_TOKENS, TraceRequest, Workload,
                     json_line, parse_lines, token_count)

MOONCAKE_BLOCK_SIZE = 512
PROMPT_SALT = 0x5241_4449_584B_5631  # "RADIXKV1"
OUTPUT_SALT = 0x4F55_5450_5554_5331  # "OUTPUTS1"
_M64 = (1 << 64) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on a uint64 array (array arithmetic wraps mod 2**64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def expand_ids(ids: np.ndarray, length: int, vocab_size: int, salt: int = PROMPT_SALT
               ) -> np.ndarray:
    """One row of `length` token ids in [0, vocab_size) per id (shape (len(ids), length))."""
    seeds = _splitmix64(np.asarray(ids, dtype=np.uint64) ^ np.uint64(salt))
    cols = np.arange(length, dtype=np.uint64)[None, :]
    out = np.empty((len(seeds), length), dtype=np.int64)
    # Chunks of ~256k words stay in cache across the mixer's passes: 8x faster than one
    # pass over the whole (ids x length) grid.
    step = max(1, (1 << 18) // max(length, 1))
    for s in range(0, len(seeds), step):
        out[s:s + step] = _splitmix64(seeds[s:s + step, None] + cols) % np.uint64(vocab_size)
    return out


@dataclass(frozen=True, slots=True)
class HashIdRow:
    """One parsed trace line."""

    lineno: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: list[int]


def _parse(line: str, lineno: int, block_size: int) -> HashIdRow:
    d = json_line(line)
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object, got {type(d).__name__}")
    for key in ("timestamp", "input_length", "output_length", "hash_ids"):
        if key not in d:
            raise ValueError(f"missing field {key!r}")
    ts, n_in, n_out, ids = d["timestamp"], d["input_length"], d["output_length"], d["hash_ids"]
    ts = finite_at_least(ts, "timestamp (ms)", 0)
    n_in = token_count(n_in, "input_length", 1)
    n_out = token_count(n_out, "output_length")
    token_count(n_in + n_out, "input_length + output_length")
    if not isinstance(ids, list):
        raise ValueError(f"hash_ids must be a list, got {type(ids).__name__}")
    # JSON gives plain ints only; type() keeps this per-id test cheap
    if not all(type(h) is int and 0 <= h <= _M64 for h in ids):
        bad = next(h for h in ids if not (type(h) is int and 0 <= h <= _M64))
        raise ValueError(f"hash_ids must hold ints in [0, 2**64), found {bad!r}")
    want = -(-n_in // block_size)
    if len(ids) != want:
        raise ValueError(f"len(hash_ids) = {len(ids)} but input_length {n_in} needs "
                         f"ceil({n_in}/{block_size}) = {want} blocks")
    return HashIdRow(lineno, ts, n_in, n_out, ids)


def check_block_size(block_size: Any) -> int:
    """A hash-id block size: an int in [1, MAX_REQUEST_TOKENS]."""
    block_size = positive_int(block_size, "block_size")
    if block_size > MAX_REQUEST_TOKENS:
        raise ValueError(f"block_size {block_size:,} is over the bound of "
                         f"{MAX_REQUEST_TOKENS:,} (2**24) tokens per request")
    return block_size


def scan_hash_id_trace(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE,
                       skip_bad: bool = False, limit: int | None = None
                       ) -> tuple[list[HashIdRow], int]:
    """Parse and validate the lines without expanding tokens: (rows, skipped lines).

    A bad line raises TraceFormatError("<file>:<line>: <what>") unless skip_bad; `limit`
    stops after that many good rows.
    """
    block_size = check_block_size(block_size)
    if limit is not None:
        limit = int_at_least(limit, "limit", 0)
    return parse_lines(path, lambda line, lineno: _parse(line, lineno, block_size),
                       skip_bad, limit)


def read_hash_id_trace(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE,
                       skip_bad: bool = False, vocab_size: int = 32000,
                       limit: int | None = None) -> Workload:
    """Read a hash-id trace into a Workload of token-id requests (see the module doc).

    Request ids are "<file stem>-<line number>"; arrival = timestamp / 1000 s.
    """
    vocab_size = check_vocab(vocab_size)
    block_size = check_block_size(block_size)
    if limit is not None:
        limit = int_at_least(limit, "limit", 0)
    path = Path(path)
    rows, skipped = scan_hash_id_trace(path, block_size, skip_bad, limit)
    total = sum(r.input_length + r.output_length for r in rows)
    if total > MAX_WORKLOAD_TOKENS:
        raise ValueError(f"{path}: {len(rows):,} requests expand to {total:,} tokens, over "
                         f"the bound of {MAX_WORKLOAD_TOKENS:,} (2**31) tokens per workload; "
                         f"read fewer lines (limit)")
    # Building millions of tuples would trigger full garbage collections that walk every
    # object built so far (a third of the load time); nothing here forms cycles.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        requests = _expand_rows(rows, path.stem, block_size, vocab_size)
    finally:
        if gc_was_enabled:
            gc.enable()
    meta = {"source": str(path), "format": "hash_ids", "block_size": block_size,
            "vocab_size": vocab_size, "limit": limit}
    return Workload(path.stem, requests, skipped=skipped, block_size=block_size, meta=meta)


def _expand_rows(rows: list[HashIdRow], stem: str, block_size: int, vocab_size: int
                 ) -> list[TraceRequest]:
    # Tuples hold one shared int object per vocabulary id instead of a fresh int per token:
    # a 60M-token trace then costs 8 bytes a token, not ~40.
    pool = np.fromiter(range(vocab_size), dtype=object, count=vocab_size)
    # Every id but a row's last covers a full block: expand each distinct one once into a
    # table that rows gather from. The last block is expanded per row to its own length,
    # so the work stays proportional to the trace's tokens whatever the block size.
    counts = [len(r.hash_ids) - 1 for r in rows]
    flat = np.fromiter((h for r in rows for h in r.hash_ids[:-1]), dtype=np.uint64,
                       count=sum(counts))
    uniq, inverse = np.unique(flat, return_inverse=True)
    runs = pool[expand_ids(uniq, block_size, vocab_size)]
    offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
    out_seeds = np.array([r.lineno for r in rows], dtype=np.uint64)
    requests = []
    for i, r in enumerate(rows):
        full = runs[inverse[offsets[i]:offsets[i + 1]]].reshape(-1).tolist()
        last = np.array(r.hash_ids[-1:], dtype=np.uint64)
        tail = pool[expand_ids(last, r.input_length - len(full), vocab_size)[0]].tolist()
        prompt = tuple(full + tail)
        out = expand_ids(out_seeds[i:i + 1], r.output_length, vocab_size, OUTPUT_SALT)
        output = tuple(pool[out[0]].tolist())
        requests.append(TraceRequest.unchecked(
            f"{stem}-{r.lineno}", r.timestamp_ms / 1000.0, prompt, output, r.output_length))
    return requests


def read_mooncake(path: str | Path, skip_bad: bool = False, vocab_size: int = 32000,
                  limit: int | None = None) -> Workload:
    """A Mooncake FAST'25 trace: a hash-id trace with 512-token blocks."""
    return read_hash_id_trace(path, MOONCAKE_BLOCK_SIZE, skip_bad, vocab_size, limit)


def _token_blocks(prompt: tuple[int, ...], block_size: int) -> list[tuple[int, int]]:
    """(chained key, token count) per block of a prompt, the last block possibly partial.

    The key hashes the previous key with the block's tokens, as the trace's hash ids do;
    Python's tuple hash of ints is not randomised, and 64-bit collisions are negligible.
    """
    out, key = [], 0
    for s in range(0, len(prompt), block_size):
        block = prompt[s:s + block_size]
        key = hash((key, block))
        out.append((key, len(block)))
    return out


def block_reuse_ratio(source: Workload | str | Path, block_size: int | None = None,
                      by: Literal["tokens", "blocks"] = "tokens",
                      skip_bad: bool = False) -> float:
    """Upper bound on prefix reuse at block granularity, with unlimited cache.

    Requests are taken in arrival order; a block (full or the partial last one) counts as
    reused iff the same block, i.e. the same chained hash id, appeared in an earlier
    request's prompt. Chaining makes this a prefix match, so it is what an infinite
    block-hash or radix cache reuses (at block, not token, granularity; outputs are not
    counted as cache content). by="tokens": reused tokens / prompt tokens (each block
    weighted by its token count); by="blocks": reused blocks / blocks.

    `source` is a Workload (blocks hashed from its token ids, block_size defaulting to the
    workload's, else 512) or the path of a hash-id trace (its hash_ids read directly).
    """
    if by not in ("tokens", "blocks"):
        raise ValueError(f"by must be 'tokens' or 'blocks', got {by!r}")
    if block_size is not None:
        block_size = check_block_size(block_size)
    seqs: list[list[tuple[Any, int]]] = []
    if isinstance(source, Workload):
        bs = block_size or source.block_size or MOONCAKE_BLOCK_SIZE
        seqs = [_token_blocks(r.prompt, bs) for r in source.requests]
    else:
        bs = block_size or MOONCAKE_BLOCK_SIZE
        rows, _ = scan_hash_id_trace(source, bs, skip_bad)
        rows.sort(key=lambda r: r.timestamp_ms)
        for r in rows:
            sizes = [bs] * (len(r.hash_ids) - 1) + [r.input_length - bs * (len(r.hash_ids) - 1)]
            seqs.append(list(zip(r.hash_ids, sizes)))
    seen: set[Any] = set()
    total = reused = 0
    for seq in seqs:
        for key, n in seq:
            w = n if by == "tokens" else 1
            total += w
            reused += w if key in seen else 0
        seen.update(k for k, _ in seq)
    return reused / total if total else 0.0
