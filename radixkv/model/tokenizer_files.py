"""The built-in byte tokenizer as a Hugging Face tokenizer directory, for the clients that insist
on one (aiperf, guidellm, inference-perf, bench_serving, the routers' own tokenizers).

`tokenizer.json`: a byte-level BPE with no merges, so every UTF-8 byte is one token whose id is
the byte (the byte-level alphabet maps bytes to printable characters and back); `<bos>`,
`<eos>`, `<pad>` are ids 256-258, special; ids 259 and up, to the model's vocabulary, are
`<|reserved_N|>` entries that no text encodes to. A post-processor puts `<bos>` before a prompt
encoded with special tokens, as the server does for a completion prompt. `tokenizer_config.json`
names the special tokens, the context length and the server's plain chat template in Jinja, so
`apply_chat_template(..., add_generation_prompt=True)` gives the ids a chat request runs on.
"""
from __future__ import annotations

import json
from pathlib import Path

from radixkv.tokenizer import ByteTokenizer, byte_level_alphabet

# the server's plain template (server/text.py), written for Hugging Face's renderer
PLAIN_CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
                       "{{ message['content'] }}\n{% endfor %}"
                       "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
SPECIALS = ("<bos>", "<eos>", "<pad>")


def write_tokenizer_dir(out: str | Path, vocab_size: int, max_model_len: int) -> Path:
    """Write the byte tokenizer of a model with `vocab_size` ids to directory `out`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    ByteTokenizer(vocab_size)                               # the same checks as the server's
    vocab = {ch: b for b, ch in enumerate(byte_level_alphabet())}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIALS)})
    vocab.update({f"<|reserved_{i}|>": i for i in range(ByteTokenizer.BYTES_AND_SPECIALS,
                                                        vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", ByteTokenizer.bos_id)])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>",
              "eos_token": "<eos>", "pad_token": "<pad>", "model_max_length": max_model_len,
              "add_bos_token": True, "clean_up_tokenization_spaces": False,
              "chat_template": PLAIN_CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}, indent=2) + "\n")
    return out
