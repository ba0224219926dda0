"""ByteTokenizer and local tokenizer.json loading."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from radixkv.shapes import get_model_config
from radixkv.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer


def test_byte_tokenizer_matches_tiny_llama():
    tok, args = ByteTokenizer(), get_model_config("tiny-llama")
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.pad_id) == (args.vocab_size, args.bos_id,
                                                                    args.eos_id, 258)


@pytest.mark.parametrize("text", ["", "hello", "héllo wörld", "日本語 🚀\n\t"])
def test_byte_round_trip(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text
    assert tok.encode(text, add_bos=True) == [256, *ids]


def test_byte_decode_specials_and_invalid_utf8():
    tok = ByteTokenizer()
    ids = [256, *b"hi", 257, 258]
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special=False) == "<bos>hi<eos><pad>"
    assert tok.decode([0xE6, 0x97]) == "\ufffd"        # truncated multi-byte sequence
    with pytest.raises(ValueError, match="token id 259 is outside the byte vocabulary"):
        tok.decode([1, 259])
    with pytest.raises(TypeError, match="encode expects str, got bytes"):
        tok.encode(b"x")


@pytest.fixture()
def hf_dir(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4, "!": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "</s>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}))
    return tmp_path


def test_hf_tokenizer_from_directory_and_file(hf_dir):
    for path in (hf_dir, hf_dir / "tokenizer.json"):
        tok = load_tokenizer(path)
        assert isinstance(tok, HFTokenizer)
        assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (6, 1, 2)
        assert tok.encode("hello world !") == [3, 4, 5]
        assert tok.encode("hello xyz", add_bos=True) == [1, 3, 0]
        assert tok.decode([1, 3, 4, 2]) == "hello world"
        assert tok.decode([1, 3], skip_special=False) == "<s> hello"


def test_hf_tokenizer_errors(hf_dir, tmp_path):
    with pytest.raises(ValueError, match="token id 6 is outside the vocabulary"):
        load_tokenizer(hf_dir).decode([6])
    with pytest.raises(ValueError, match="special token '<bos>' is not in the vocabulary"):
        HFTokenizer(hf_dir, bos_token="<bos>")
    (hf_dir / "tokenizer_config.json").write_text("{")
    with pytest.raises(ValueError, match="tokenizer_config.json: malformed JSON"):
        load_tokenizer(hf_dir)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tokenizer.json").write_text('{"model": 1}')
    with pytest.raises(ValueError, match="bad/tokenizer.json: not a valid tokenizer.json"):
        load_tokenizer(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no tokenizer file at .*empty/tokenizer.json"):
        load_tokenizer(empty)


def test_load_tokenizer_default_and_missing(tmp_path):
    assert isinstance(load_tokenizer(None), ByteTokenizer)
    with pytest.raises(FileNotFoundError, match="tokenizer path .*missing.* does not exist"):
        load_tokenizer(tmp_path / "missing")


def test_long_text_encodes_the_same_in_slices(hf_dir):
    """Past GIL_SLICE the byte tokenizer encodes in slices, and the HF one always takes its fast
    batch path (both let other threads run); the ids are exactly those of one whole encode."""
    from radixkv.tokenizer import GIL_SLICE
    text = "héllo wörld! " * (3 * GIL_SLICE // 13 + 5)          # > 3 slices of UTF-8 bytes
    assert len(text) > GIL_SLICE
    tok = ByteTokenizer()
    assert tok.encode(text, add_bos=True) == [256, *text.encode("utf-8")]
    hf = load_tokenizer(hf_dir)
    long = "hello world ! xyz " * (GIL_SLICE // 18 + 7)
    assert len(long) > GIL_SLICE
    assert hf.encode(long, add_bos=True) == [1, *[3, 4, 5, 0] * (GIL_SLICE // 18 + 7)]
    for n in (0, 1, 56, 57, 1000):
        text = "hello world ! xyz " * n
        assert hf.encode(text) == hf._tok.encode(text, add_special_tokens=False).ids \
            == [3, 4, 5, 0] * n


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE with merges learned from a small corpus, and a special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "héllo wörld 日本語 🙂",
              "def f(x):\n    return x  +  1\n"] * 20
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = tmp_path_factory.mktemp("bpe")
    tok.save(str(out / "tokenizer.json"))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from(
    ["the ", " fox", "<s>", "  ", "\n\n", "wörld", "🙂", "return x"])), max_size=12))
def test_the_fast_batch_path_encodes_as_the_plain_encode(bpe_dir, parts):
    # the switch to encode_batch_fast (no offsets): the same ids as a plain encode for any text,
    # merges, special tokens, whitespace runs and astral code points included
    hf, text = load_tokenizer(bpe_dir), "".join(parts)
    assert hf.encode(text) == hf._tok.encode(text, add_special_tokens=False).ids
    assert hf.count(text) == len(hf.encode(text))


def test_count_is_the_length_of_encode(hf_dir):
    for tok in (ByteTokenizer(), load_tokenizer(hf_dir)):
        for text in ("", "hello world !", "héllo xyz " * 50):
            for bos in (False, True):
                assert tok.count(text, add_bos=bos) == len(tok.encode(text, add_bos=bos))
