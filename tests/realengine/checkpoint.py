"""`python tests/realengine/checkpoint.py OUT_DIR`: build, offline and deterministically, the tiny
random-weight Llama checkpoint that the real-engine tests serve with vLLM.

The model: LlamaConfig hidden 256, intermediate 688, 4 layers, 4 attention heads, 2 KV heads
(head_dim 64), vocab 8192, 4096 positions, bf16 safetensors. Its KV cache is 4 layers x (K, V)
x 2 heads x 64 x 2 bytes = 2,048 bytes a token. The tokenizer: a byte-level BPE of 8192 entries
trained on seeded pseudo-English, BOS prepended, the chat template `<|role|>\\ncontent<|end|>\\n`
per message and `<|assistant|>\\n` as the generation prompt. Nothing is downloaded.

OUT_DIR gets a stamp, `radixkv-checkpoint.json`, written last, naming BUILDER_VERSION:
install.py rebuilds when it is absent or names another version."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

# bump when anything below changes what lands in OUT_DIR
BUILDER_VERSION = 1
STAMP = "radixkv-checkpoint.json"

VOCAB = 8192
SPECIALS = ["<s>", "</s>", "<unk>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# the words of the pseudo-English: a fixed list of common words and seeded made-up ones
COMMON = (
    "the of and to in is that it for on with as was at by be this from or an are not have has "
    "but what all were when we there can which their if will one each about how up out them then "
    "she many some so these would other into time two more write go see number no way could "
    "people my than first water been call who its now find long down day did get come made may "
    "part cache prefix block token request server model user assistant system hello world please "
    "answer question"
).split()
ONSETS = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
          "bl", "br", "cr", "dr", "fl", "gr", "pl", "pr", "sl", "st", "tr", "sh", "ch", "th"]
NUCLEI = ["a", "e", "i", "o", "u", "ai", "ee", "ea", "oo", "ou", "y"]
CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "st", "ck", "ng"]


def made_up_word(rng: random.Random) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(NUCLEI) + rng.choice(CODAS)
                   for _ in range(rng.randint(1, 3)))


def corpus(seed: int = 2024, lines: int = 6000) -> list[str]:
    """`lines` paragraphs of eight sentences each, the same for the same seed."""
    rng = random.Random(seed)
    lexicon = COMMON + sorted({made_up_word(rng) for _ in range(6000)})

    def sentence() -> str:
        words = [rng.choice(COMMON) if rng.random() < 0.4 else rng.choice(lexicon)
                 for _ in range(rng.randint(4, 18))]
        if rng.random() < 0.2:
            words.append(str(rng.randint(0, 99_999)))
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice(".,?!;:")

    return [" ".join(sentence() for _ in range(8)) for _ in range(lines)]


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    if tok.get_vocab_size() != VOCAB:
        raise RuntimeError(f"the tokenizer has {tok.get_vocab_size()} entries, not {VOCAB}: "
                           "the corpus is too small for the vocabulary")
    bos = tok.token_to_id("<s>")
    # Llama's tokenizers prepend BOS to every encoded text
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>", additional_special_tokens=SPECIALS[4:], model_max_length=4096,
        clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    hf.save_pretrained(out)
    return hf


def build_model(out: Path, tok) -> int:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rms_norm_eps=1e-5, rope_theta=10_000.0, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.generation_config.do_sample = False
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / STAMP).unlink(missing_ok=True)
    tok = build_tokenizer(out)
    params = build_model(out, tok)
    ids = tok("Hello world, the prefix cache block.")["input_ids"]
    if ids[0] != tok.bos_token_id:
        raise RuntimeError(f"the tokenizer does not prepend BOS: {ids}")
    (out / STAMP).write_text(json.dumps({"builder": BUILDER_VERSION}) + "\n")
    print(f"{out}: {params / 1e6:.2f} M parameters, {len(tok)} tokens, "
          f"files {', '.join(sorted(p.name for p in out.iterdir()))}")


def built(out: Path) -> bool:
    """Whether `out` holds a checkpoint of this BUILDER_VERSION."""
    try:
        return json.loads((out / STAMP).read_text()).get("builder") == BUILDER_VERSION
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/realengine/checkpoint.py OUT_DIR")
    build(Path(sys.argv[1]))
