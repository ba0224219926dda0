"""`radixkv tokenizer DIR`: the exported Hugging Face directory encodes, decodes and renders chats
exactly as the server's byte tokenizer does (checked through the `tokenizers` library and
transformers' AutoTokenizer, against random text), for a byte-sized and a large vocabulary."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixkv.cli import main
from radixkv.model.tokenizer import ByteTokenizer, HFTokenizer
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
    hf = HFTokenizer(out)
    assert hf.encode(text, add_bos=True) == bt.encode(text, add_bos=True)
    ids = bt.encode(text)
    assert hf.decode(ids) == bt.decode(ids) == text


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
