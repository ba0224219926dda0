"""OpenAI chat logs: the message mapping, the template, prefix sharing through a real
tokenizer.json, timestamps, dispatch from load_workload, and bad lines."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from radixkv.tokenizer import load_tokenizer
from radixkv.workloads import (TraceFormatError, load_workload, read_chat_log, render_prompt,
                               trace_format)
from radixkv.workloads.chatlog import ChatMessage, parse_messages

WORDS = ["[UNK]", "<|", "|>", "system", "user", "assistant", "you", "help", "hi", "there",
         "hello", "how", "are", "fine", "thanks", "ok", "and", "bye", ".", "?", ","]
SYSTEM = {"role": "system", "content": "you help ."}
U1 = {"role": "user", "content": "hi there , how are you ?"}
A1 = {"role": "assistant", "content": "fine , thanks . and you ?"}
U2 = {"role": "user", "content": "ok . bye"}
A2 = {"role": "assistant", "content": "bye ."}
U3 = {"role": "user", "content": "hello ?"}


@pytest.fixture(scope="module")
def wordlevel(tmp_path_factory):
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    t.save(str(path))
    return load_tokenizer(path)


@pytest.fixture(scope="module")
def bytelevel(tmp_path_factory):
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [render_prompt(parse_messages([SYSTEM, U1, A1, U2])) + A2["content"]] * 4
    t.train_from_iterator(corpus, trainer)
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    t.save(str(path))
    return load_tokenizer(path)


def write_log(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n"
                            for r in records))
    return path


def test_template_is_exactly_as_documented():
    msgs = parse_messages([SYSTEM, U1])
    assert render_prompt(msgs) == ("<|system|>\nyou help .\n<|user|>\nhi there , how are you ?"
                                   "\n<|assistant|>\n")
    parts = {"role": "user", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]}
    assert parse_messages([parts, {"role": "assistant", "content": None}]) == [
        ChatMessage("user", "ab"), ChatMessage("assistant", "")]


@pytest.mark.parametrize("tok_name", ["wordlevel", "bytelevel"])
def test_turns_share_prefixes_after_tokenization(tmp_path, request, tok_name):
    tok = request.getfixturevalue(tok_name)
    p = write_log(tmp_path / "chat.jsonl", [
        {"messages": [SYSTEM, U1, A1], "user": "alice"},
        {"messages": [SYSTEM, U1, A1, U2, A2], "user": "alice"},
        {"messages": [SYSTEM, U1, A1, U2, A2, U3], "user": "alice", "max_tokens": 7},
    ])
    t1, t2, t3 = read_chat_log(p, tok)
    assert t1.prompt == tuple(tok.encode(render_prompt(parse_messages([SYSTEM, U1]))))
    assert t1.output == tuple(tok.encode(A1["content"])) and t1.output_len > 0
    # each turn re-sends the previous prompt and its recorded reply, token for token
    assert t2.prompt[:t1.prompt_len + t1.output_len] == t1.prompt + t1.output
    assert t3.prompt[:t2.prompt_len + t2.output_len] == t2.prompt + t2.output
    assert t2.prompt_len > t1.prompt_len + t1.output_len
    assert t3.output is None and t3.output_len == 7
    assert {r.session for r in (t1, t2, t3)} == {r.routing_key for r in (t1, t2, t3)} == {"alice"}


def test_mapping_ids_output_lengths_and_meta(tmp_path, wordlevel):
    p = write_log(tmp_path / "log.jsonl", [
        {"id": "r1", "messages": [U1]},
        {"messages": [U1], "max_tokens": 5, "max_completion_tokens": 6},
        {"messages": [U1], "output_len": 4, "max_tokens": 9},
        {"messages": [U1], "max_tokens": None, "model": "x", "temperature": 0.2},
        {"messages": [U1, A1], "max_tokens": 1},
    ])
    w = read_chat_log(p, wordlevel)
    assert [r.id for r in w] == ["r1", "log-2", "log-3", "log-4", "log-5"]
    assert [r.output_len for r in w][:4] == [256, 6, 4, 256]
    assert w[4].output_len == len(wordlevel.encode(A1["content"]))   # the reply, not max_tokens
    assert w[0].session is None and all(r.arrival == 0.0 for r in w)
    assert w.meta["source"] == str(p) and w.meta["format"] == "openai_chat"
    assert w.meta["role_template"] == "<|{role}|>\n{content}\n"
    assert read_chat_log(p, wordlevel, default_output_len=3)[0].output_len == 3
    bos = read_chat_log(p, load_tokenizer(None), add_bos=True)[0]
    assert bos.prompt[0] == 256 and bos.prompt[1:] == tuple(render_prompt(
        parse_messages([U1])).encode())


def test_timestamps_relative_to_the_earliest(tmp_path, wordlevel):
    p = write_log(tmp_path / "t.jsonl", [
        {"messages": [U1], "timestamp": "2024-05-01T12:00:01.5Z"},
        {"messages": [U2], "timestamp": "2024-05-01T12:00:00+00:00"},
        {"messages": [U3]},                                 # arrives with the line before
        {"messages": [U1], "timestamp": "2024-05-01T14:00:03+02:00"},
    ])
    w = read_chat_log(p, wordlevel)
    assert {r.id: r.arrival for r in w} == {"t-1": 1.5, "t-2": 0.0, "t-3": 0.0, "t-4": 3.0}
    assert [r.id for r in w] == ["t-2", "t-3", "t-1", "t-4"]
    q = write_log(tmp_path / "n.jsonl", [
        {"messages": [U1]},
        {"messages": [U1], "timestamp": 1714564800.25},
        {"messages": [U1]},
        {"messages": [U1], "timestamp": 1714564802},
    ])
    assert [r.arrival for r in read_chat_log(q, wordlevel)] == [0.0, 0.0, 0.0, 1.75]


def test_load_workload_dispatch(tmp_path, wordlevel):
    p = write_log(tmp_path / "c.jsonl", [{"messages": [U1, A1]}, {"messages": [U2]}])
    assert trace_format(p) == "openai_chat"
    w = load_workload(p, tokenizer=wordlevel, skip_bad=True)
    assert w == read_chat_log(p, wordlevel) and w.meta["source"] == str(p)
    with pytest.raises(ValueError, match=r"c\.jsonl is an OpenAI chat log: give a tokenizer "
                                         r"\(--tokenizer tokenizer.json\)"):
        load_workload(p)
    with pytest.raises(ValueError, match="block_size applies to hash-id traces only"):
        load_workload(p, tokenizer=wordlevel, block_size=64)
    with pytest.raises(ValueError, match="unknown parameter 'vocab_size'"):
        load_workload(p, tokenizer=wordlevel, vocab_size=300)
    other = tmp_path / "j.jsonl"
    other.write_text(json.dumps({"id": "a", "arrival": 0, "prompt": [1], "output_len": 1})
                     + "\n")
    with pytest.raises(ValueError, match="tokenizer applies to OpenAI chat logs only"):
        load_workload(other, tokenizer=wordlevel)
    assert len(load_workload(other, tokenizer=None, block_size=None)) == 1


GOOD = {"messages": [U1]}


@pytest.mark.parametrize("bad, what", [
    ("{nope", "Expecting property name"),
    ('["messages"]', "expected a JSON object"),
    ({"prompt": "hi"}, "missing field 'messages'"),
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": "hi"}, "messages must be a non-empty list"),
    ({"messages": ["hi"]}, "messages[0] must be an object"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role must be a non-empty string"),
    ({"messages": [U1, {"role": "user", "content": 3}]}, "messages[1].content must be"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content[0] is not a text part"),
    ({"messages": [A1]}, "only an assistant reply"),
    ({"messages": [U1], "timestamp": "yesterday"}, "timestamp 'yesterday'"),
    ({"messages": [U1], "timestamp": float("nan")}, "timestamp must be"),
    ({"messages": [U1], "timestamp": True}, "timestamp must be"),
    ({"messages": [U1], "user": 7}, "user must be a str"),
    ({"messages": [U1], "id": 7}, "id must be a non-empty string"),
    ({"messages": [U1], "id": "log-1"}, "duplicate request id 'log-1'"),
    ({"messages": [U1], "max_tokens": 10**12}, "max_tokens 1,000,000,000,000 is over the bound"),
    ({"messages": [U1], "output_len": -1}, "output_len must be an int >= 0"),
    ({"messages": [U1], "max_tokens": 1.5}, "max_tokens must be an int"),
])
def test_bad_lines_name_file_and_line(tmp_path, wordlevel, bad, what):
    p = write_log(tmp_path / "log.jsonl", [GOOD, bad, GOOD])
    with pytest.raises(TraceFormatError) as e:
        read_chat_log(p, wordlevel)
    assert f"{p}:2: " in str(e.value) and what in str(e.value)
    w = read_chat_log(p, wordlevel, skip_bad=True)
    assert w.skipped == 1 and [r.id for r in w] == ["log-1", "log-3"]


def test_not_utf8_chat_log(tmp_path, wordlevel):
    p = tmp_path / "log.jsonl"
    p.write_bytes(json.dumps(GOOD).encode() + b"\n" + b'{"messages": "\xff"}\n'
                  + json.dumps(GOOD).encode() + b"\n")
    assert trace_format(p) == "openai_chat"
    with pytest.raises(TraceFormatError, match=rf"{p}:2: not UTF-8 text: byte 0xff"):
        load_workload(p, tokenizer=wordlevel)
    assert load_workload(p, tokenizer=wordlevel, skip_bad=True).skipped == 1


def test_request_size_bound_applies_to_tokenized_prompts(tmp_path):
    p = write_log(tmp_path / "big.jsonl", [{"messages": [U1], "max_tokens": 2**24 - 10}])
    with pytest.raises(TraceFormatError, match="prompt \\+ output length .* over the bound"):
        read_chat_log(p, load_tokenizer(None))


def test_empty_chat_log(tmp_path, wordlevel):
    p = write_log(tmp_path / "e.jsonl", [])
    w = read_chat_log(p, wordlevel)
    assert len(w) == 0 and w.skipped == 0
