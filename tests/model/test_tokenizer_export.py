"""`radixkv tokenizer DIR`: the exported Hugging Face directory encodes, decodes and renders chats
exactly as the server's byte tokenizer does (checked through the `tokenizers` library and
transformers' AutoTokenizer, against random text), for a byte-sized and a large vocabulary."""
from __future__ import annotations

import copy
import functools
import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from radixkv.cli import main
from radixkv.tokenizer import ByteTokenizer, HFTokenizer
from radixkv.tokenizer import plain_bytes_specials
from radixkv.model.tokenizer_files import byte_level_alphabet
from radixkv.server.text import ChatTemplate


@pytest.fixture(scope="module", params=["tiny-llama", "llama-3-8b"])
def exported(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(request.param)
    assert main(["tokenizer", str(out), "--model", request.param]) == 0
    vocab = {"tiny-llama": 259, "llama-3-8b": 128256}[request.param]
    return out, ByteTokenizer(vocab)


def test_the_files_and_their_special_tokens(exported):
    out, bt = exported
    assert sorted(p.name for p in out.iterdir()) == ["special_tokens_map.json", "tokenizer.json",
                                                     "tokenizer_config.json"]
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == ("<bos>", "<eos>", "<pad>")
    hf = HFTokenizer(out)
    assert (hf.vocab_size, hf.bos_id, hf.eos_id) == (bt.vocab_size, 256, 257)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=60))
def test_encode_and_decode_agree_with_the_server(exported, text):
    out, bt = exported
    hf = loaded(out)
    assume(not any(t in text for t in ("<bos>", "<eos>", "<pad>")))   # see the test below
    assert hf.encode(text, add_bos=True) == bt.encode(text, add_bos=True)
    ids = bt.encode(text)
    assert hf.decode(ids) == bt.decode(ids) == text


def test_a_special_tokens_text_is_its_id_to_tokenizers_and_bytes_to_the_server(exported):
    # a known difference: every client loading the directory splits added tokens out of text
    out, bt = exported
    assert loaded(out).encode("a<eos>") == [97, 257]
    assert bt.encode("a<eos>") == [97, 60, 101, 111, 115, 62]


@functools.cache
def loaded(out) -> HFTokenizer:
    return HFTokenizer(out)


SPECIAL_OR_TEXT = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(
    ["<bos>", "<eos>", "<pad>", "<bo", "s>", "<|reserved_300|>"]))).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=SPECIAL_OR_TEXT)
def test_the_byte_shortcut_encodes_exactly_as_tokenizers_does(exported, text):
    # text without an added token's string is its UTF-8 bytes; with one, tokenizers encodes it
    out, _ = exported
    hf = loaded(out)
    assert hf._specials == ("<bos>", "<eos>", "<pad>")
    want = hf._tok.encode(text, add_special_tokens=False).ids
    assert hf.encode(text) == want and hf.count(text) == len(want)
    assert hf.encode(text, add_bos=True) == [256, *want]


def test_only_a_plain_byte_vocabulary_takes_the_shortcut(exported):
    out, _ = exported
    spec = json.loads((out / "tokenizer.json").read_text())
    assert plain_bytes_specials(spec) == ("<bos>", "<eos>", "<pad>")
    a, b = byte_level_alphabet()[ord("a")], byte_level_alphabet()[ord("b")]

    def changed(edit) -> tuple | None:
        s = copy.deepcopy(spec)
        edit(s)
        return plain_bytes_specials(s)
    assert changed(lambda s: s["model"].update(merges=[[a, b]])) is None      # merges pairs
    assert changed(lambda s: s.update(normalizer={"type": "NFC"})) is None
    assert changed(lambda s: s["pre_tokenizer"].update(use_regex=True)) is None
    assert changed(lambda s: s["model"]["vocab"].update({a: 300})) is None   # ids not bytes
    assert changed(lambda s: s["model"].update(type="WordPiece")) is None
    with pytest.raises(TypeError):               # a lone surrogate: refused as before
        loaded(out).encode("x\udc80")


def test_transformers_loads_it_and_renders_the_servers_chat(exported):
    from transformers import AutoTokenizer
    out, bt = exported
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("héllo ✓")["input_ids"] == bt.encode("héllo ✓", add_bos=True)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "naïve?"},
            {"role": "assistant", "content": "Yes."}, {"role": "user", "content": "Again"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids == ChatTemplate(bt).encode([(m["role"], m["content"]) for m in msgs])
    assert tok.decode(ids, skip_special_tokens=True) == bt.decode(ids)


def test_reserved_ids_decode_to_their_names_and_text_never_encodes_to_them():
    bt = ByteTokenizer(300)
    assert bt.decode([104, 299, 105]) == "h<|reserved_299|>i"
    assert bt.encode("<|reserved_299|>") == list(b"<|reserved_299|>")
    with pytest.raises(ValueError, match=r"token id 300 is outside the byte vocabulary \[0, 300\)"):
        bt.decode([300])
    with pytest.raises(ValueError, match="a byte tokenizer's vocabulary holds at least 259 ids"):
        ByteTokenizer(100)


def test_the_byte_alphabet_is_a_bijection_onto_printable_characters():
    alpha = byte_level_alphabet()
    assert len(set(alpha)) == 256 and alpha[ord("A")] == "A" and alpha[ord(" ")] == "\u0120"
    assert all(ch.isprintable() for ch in alpha)


def test_a_checkpoint_is_copied_and_bad_input_is_one_line(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert main(["tokenizer", str(ckpt), "--model", "tiny-llama"]) == 0
    copy = tmp_path / "copy"
    assert main(["tokenizer", str(copy), "--model", str(ckpt)]) == 0
    assert (copy / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    capsys.readouterr()
    assert main(["tokenizer", str(tmp_path / "x"), "--model", "gpt-9"]) == 2
    assert capsys.readouterr().err.strip() == (
        "radixkv tokenizer: error: unknown model 'gpt-9': not a named model (tiny-llama, "
        "tiny-llama-4l, llama-3-8b, llama-3.1-8b, llama-3-70b, qwen2-7b) nor a checkpoint "
        "directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["tokenizer", str(tmp_path / "y"), "--model", str(empty)]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err
    afile = tmp_path / "file"
    afile.write_text("x")
    assert main(["tokenizer", str(afile)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err
