"""Tokenizers: a built-in byte-level one (matches the tiny-* models) and local HF tokenizer.json."""
from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

# Encoding a long text lets other threads (an event loop serving streams, an engine stepping)
# run meanwhile: the byte tokenizer's bytes go in slices of GIL_SLICE; HF's fast batch path
# releases the GIL and, tracking no offsets, takes half the time of a plain encode at every
# length (measured: 221 against 410 us for 2,625 characters, 4.3 against 5.4 us for 20).
GIL_SLICE = 1 << 16


class Tokenizer(Protocol):
    vocab_size: int
    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str, add_bos: bool = False) -> list[int]: ...

    def count(self, text: str, add_bos: bool = False) -> int: ...

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; bos=256, eos=257, pad=258 (vocab 259, as tiny-llama). A model
    with a larger vocabulary keeps its size: ids 259.. are reserved tokens, written
    `<|reserved_N|>`, which text never encodes to (what `radixkv tokenizer` exports)."""

    bos_id = 256
    eos_id = 257
    pad_id = 258
    BYTES_AND_SPECIALS = 259

    def __init__(self, vocab_size: int = BYTES_AND_SPECIALS):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or \
                vocab_size < self.BYTES_AND_SPECIALS:
            raise ValueError(f"a byte tokenizer's vocabulary holds at least "
                             f"{self.BYTES_AND_SPECIALS} ids, got {vocab_size!r}")
        self.vocab_size = vocab_size

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        data = text.encode("utf-8")
        ids = [self.bos_id] if add_bos else []
        for at in range(0, len(data), GIL_SLICE):
            ids.extend(data[at:at + GIL_SLICE])
        return ids

    def count(self, text: str, add_bos: bool = False) -> int:
        """len(encode(text, add_bos)), without building the ids."""
        return len(text.encode("utf-8")) + bool(add_bos)

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Bytes to text (invalid UTF-8 becomes U+FFFD); specials dropped or shown as <bos> etc.;
        a reserved id as its name."""
        names = {self.bos_id: "<bos>", self.eos_id: "<eos>", self.pad_id: "<pad>"}
        out, buf = [], bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            if i in names and skip_special:
                continue
            if not (0 <= i < self.vocab_size):
                raise ValueError(f"token id {i} is outside the byte vocabulary [0, {self.vocab_size})")
            out.append(buf.decode("utf-8", errors="replace") + names.get(i, f"<|reserved_{i}|>"))
            buf = bytearray()
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)


class HFTokenizer:
    """A local tokenizer.json (file, or a directory holding it) through the `tokenizers` library.

    bos/eos come from the arguments, else tokenizer_config.json beside the file, else None.
    """

    def __init__(self, path: str | Path, bos_token: str | None = None, eos_token: str | None = None):
        from tokenizers import Tokenizer as _Tok

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer file at {str(file)!r}")
        try:
            self._tok = _Tok.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise ValueError(f"{file}: not a valid tokenizer.json ({e})") from None
        # a byte vocabulary (radixkv's own, exported by `radixkv tokenizer`): text with none of
        # its added tokens in it is its UTF-8 bytes (4,100 characters: 25 µs, against 358 µs
        # through `tokenizers`)
        try:
            self._specials = plain_bytes_specials(json.loads(file.read_text(encoding="utf-8")))
        except (ValueError, AttributeError, TypeError):
            self._specials = None
        extra = self._read_config(file.parent / "tokenizer_config.json")
        self.vocab_size: int = self._tok.get_vocab_size(with_added_tokens=True)
        self.bos_id = self._token_id(bos_token or extra.get("bos_token"), file)
        self.eos_id = self._token_id(eos_token or extra.get("eos_token"), file)

    @staticmethod
    def _read_config(path: Path) -> dict:
        if not path.is_file():
            return {}
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: malformed JSON ({e})") from None
        # Special tokens may be plain strings or {"content": ...} objects.
        return {k: (v.get("content") if isinstance(v, dict) else v) for k, v in cfg.items()
                if k in ("bos_token", "eos_token")}

    def _token_id(self, token: str | None, file: Path) -> int | None:
        if token is None:
            return None
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise ValueError(f"{file}: special token {token!r} is not in the vocabulary")
        return tid

    def _bytes(self, text: str) -> bytes | None:
        """`text` as UTF-8 when that is its encoding in this vocabulary (else None)."""
        if self._specials is None or not isinstance(text, str) or \
                any(t in text for t in self._specials):
            return None
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:                 # a lone surrogate: refused as tokenizers does
            return None

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        data = self._bytes(text)
        ids = list(data) if data is not None else \
            self._tok.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else ids

    def count(self, text: str, add_bos: bool = False) -> int:
        """len(encode(text, add_bos)), without the GIL or a list of ids."""
        data = self._bytes(text)
        n = len(data) if data is not None else \
            len(self._tok.encode_batch_fast([text], add_special_tokens=False)[0])
        return n + (add_bos and self.bos_id is not None)

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        return self._tok.decode(ids, skip_special_tokens=skip_special)


def load_tokenizer(path: str | Path | None = None, vocab_size: int | None = None) -> Tokenizer:
    """None -> ByteTokenizer (of `vocab_size` ids, at least its own 259); otherwise a
    tokenizer.json file or a directory holding one."""
    if path is None:
        return ByteTokenizer(max(vocab_size or 0, ByteTokenizer.BYTES_AND_SPECIALS))
    if not Path(path).exists():
        raise FileNotFoundError(f"tokenizer path {str(path)!r} does not exist")
    return HFTokenizer(path)


def byte_level_alphabet() -> list[str]:
    """The character standing for each byte 0..255 in a byte-level vocabulary (GPT-2's table:
    printable bytes stand for themselves, the rest are shifted past U+0100)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
        list(range(0xAE, 0x100))
    shifted, out = 0, []
    for b in range(256):
        if b in keep:
            out.append(chr(b))
        else:
            out.append(chr(256 + shifted))
            shifted += 1
    return out


def plain_bytes_specials(spec: dict) -> tuple[str, ...] | None:
    """For a tokenizer.json (parsed) that encodes text as its UTF-8 bytes, ids equal to the byte
    values (a byte-level BPE with no merges over this alphabet, nothing normalised or split):
    its added tokens' texts, which it encodes apart wherever they occur. Else None."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or model.get("merges") or model.get("dropout") \
            or model.get("byte_fallback") or spec.get("normalizer") is not None \
            or pre.get("type") != "ByteLevel" or pre.get("use_regex", True) \
            or pre.get("add_prefix_space"):
        return None
    vocab = model.get("vocab") or {}
    if any(vocab.get(ch) != b for b, ch in enumerate(byte_level_alphabet())):
        return None
    added = spec.get("added_tokens") or []
    if any(not isinstance(t.get("content"), str) or not t["content"] for t in added):
        return None
    return tuple(t["content"] for t in added)
