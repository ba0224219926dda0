"""Which chat template a checkpoint directory gives (server/text.py): its chat_template.jinja
(where transformers 5 writes it), else the chat_template of its tokenizer_config.json, else the
plain one; and what each renders."""
from __future__ import annotations

import json

import pytest

from radixkv.server.text import ChatTemplate

JINJA = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
OLD = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}"
TURNS = [("system", "be brief"), ("user", "hi")]


def checkpoint(tmp_path, jinja: str | None, config_template: str | None):
    cfg = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    if config_template is not None:
        cfg["chat_template"] = config_template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    if jinja is not None:
        (tmp_path / "chat_template.jinja").write_text(jinja)
    return ChatTemplate.for_model(None, str(tmp_path))


def test_the_jinja_file_is_the_template_transformers_5_saves(tmp_path):
    t = checkpoint(tmp_path, JINJA, None)
    assert t.name == "checkpoint"
    assert t.render(TURNS) == "<|system|>\nbe brief<|end|>\n<|user|>\nhi<|end|>\n<|assistant|>\n"


def test_the_jinja_file_wins_over_the_config_and_the_config_is_read_without_it(tmp_path):
    assert checkpoint(tmp_path, JINJA, OLD).render(TURNS).startswith("<|system|>")
    (tmp_path / "chat_template.jinja").unlink()
    assert ChatTemplate.for_model(None, str(tmp_path)).render(TURNS) == \
        "<s>[system] be brief[user] hi"


def test_a_directory_without_a_template_takes_the_plain_one(tmp_path):
    t = checkpoint(tmp_path, None, None)
    assert t.name == "plain" and ChatTemplate.for_model(None, None).name == "plain"
    assert t.render(TURNS) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"


def test_a_malformed_config_is_named(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(ValueError, match="tokenizer_config.json: malformed JSON"):
        ChatTemplate.for_model(None, str(tmp_path))
