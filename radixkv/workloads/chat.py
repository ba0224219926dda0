"""Conversational generators: the customer-support agent and plain multi-turn chat.

Timing model (both): sessions start as a Poisson process at `rate` (sessions per second);
turn k+1 of a conversation arrives at turn k's arrival + a nominal generation time
(reply length x `tpot` seconds) + an exponential think time of mean `think_time`, so
turns of one conversation keep their order. With rate None (or inf) every arrival is 0 and
the list keeps the order of the same schedule at 1 session/s (see `_common.NOMINAL_RATE`).
"""
from __future__ import annotations

from radixkv.argcheck import finite_at_least, int_at_least

from ._common import (Builder, Range, check_budget, check_range, check_rate, check_vocab,
                      conversation, length, starts, streams, tokens, turn_times)
from .record import Workload


def support(num_users: int = 200, turns: int = 5, rag_fraction: float = 0.2,
            system_len: int = 512, fewshot_len: int = 1543, rag_len: int = 2112,
            msg_len: Range = (40, 160), reply_len: Range = (100, 400),
            think_time: float = 10.0, tpot: float = 0.02, rate: float | None = None,
            seed: int = 0, vocab_size: int = 32000) -> Workload:
    """The built-in customer-support agent.

    Every chat prompt is S + F + history + new message, where S is a `system_len`-token
    system prompt shared by all requests, F a `fewshot_len`-token few-shot block shared by
    all chat requests, and history the conversation's earlier messages and replies (the
    replies exactly as the earlier turns' `output`). Message lengths are uniform in
    `msg_len`, reply lengths uniform in `reply_len` (inclusive).

    RAG requests are single-turn: S + their own `rag_len` tokens (retrieved context and
    query, shared with nobody), output a reply. Their number is round(rag_fraction x chat
    requests): the defaults give 200 users x 5 turns = 1,000 chat requests + 200 RAG
    requests = 1,200 requests (RAG = 16.7% of all, 20% of the chat count).

    `rate` counts session starts per second, conversations and RAG requests together:
    one Poisson stream whose arrivals are assigned to conversations or RAG requests in a
    seeded random order, so RAG traffic interleaves with conversation starts.
    """
    num_users = int_at_least(num_users, "num_users", 0)
    turns = int_at_least(turns, "turns", 1)
    rag_fraction = finite_at_least(rag_fraction, "rag_fraction")
    system_len = int_at_least(system_len, "system_len", 1)
    fewshot_len = int_at_least(fewshot_len, "fewshot_len", 0)
    rag_len = int_at_least(rag_len, "rag_len", 1)
    msg_len = check_range("msg_len", msg_len)
    reply_len = check_range("reply_len", reply_len, lo=0)
    think_time = finite_at_least(think_time, "think_time")
    tpot = finite_at_least(tpot, "tpot")
    orate = check_rate(rate)
    vocab_size = check_vocab(vocab_size)
    share = rag_fraction * num_users * turns
    # An absurd rag_fraction would overflow round(); 2**63 RAG requests is already refused.
    num_rag = round(share) if share < 2.0**63 else 2**63
    if num_users + num_rag == 0:
        raise ValueError("support needs num_users > 0 or rag_fraction > 0")
    conv_total, conv_largest = _conversation_size(system_len + fewshot_len, turns, msg_len,
                                                  reply_len)
    rag_req = system_len + rag_len + reply_len[1]
    check_budget("support", dict(num_users=num_users, turns=turns, rag_fraction=rag_fraction,
                                 system_len=system_len, fewshot_len=fewshot_len,
                                 rag_len=rag_len, msg_len=msg_len, reply_len=reply_len),
                 requests=num_users * turns + num_rag,
                 total=system_len + fewshot_len + num_users * conv_total + num_rag * rag_req,
                 largest=max(conv_largest, rag_req), at_least=share >= 2.0**63)

    content, timing = streams("support", seed)
    system = tokens(content, system_len, vocab_size)
    fewshot = tokens(content, fewshot_len, vocab_size)
    convs = [conversation(content, system + fewshot, turns, msg_len, reply_len, vocab_size)
             for _ in range(num_users)]
    rags = [(system + tokens(content, rag_len, vocab_size),
             tokens(content, length(content, reply_len), vocab_size))
            for _ in range(num_rag)]

    t0 = starts(timing, num_users + num_rag, orate)
    is_rag = timing.permutation([False] * num_users + [True] * num_rag).tolist()
    conv_starts = [t for t, r in zip(t0, is_rag) if not r]
    rag_starts = [t for t, r in zip(t0, is_rag) if r]

    b = Builder("support", orate, dict(
        num_users=num_users, turns=turns, rag_fraction=rag_fraction, system_len=system_len,
        fewshot_len=fewshot_len, rag_len=rag_len, msg_len=msg_len, reply_len=reply_len,
        think_time=think_time, tpot=tpot, rate=rate, seed=seed, vocab_size=vocab_size))
    for u, (conv, start) in enumerate(zip(convs, conv_starts)):
        times = turn_times(timing, start, [len(o) for _, o in conv], think_time, tpot)
        for t, ((prompt, out), at) in enumerate(zip(conv, times)):
            b.add(at, id=f"support-u{u}-t{t}", prompt=prompt, output=out, session=f"u{u}")
    for i, ((prompt, out), at) in enumerate(zip(rags, rag_starts)):
        b.add(at, id=f"support-rag{i}", prompt=prompt, output=out, session=f"rag{i}")
    return b.build()


def multiturn(num_users: int = 100, turns: int = 6, system_len: int = 0,
              msg_len: Range = (20, 200), reply_len: Range = (50, 400),
              think_time: float = 10.0, tpot: float = 0.02, rate: float | None = None,
              seed: int = 0, vocab_size: int = 32000) -> Workload:
    """Plain multi-turn chat: `num_users` conversations of `turns` turns each.

    Sharing happens only within a conversation (turn k+1 re-sends turn k's prompt and
    reply), unless `system_len` > 0 adds a system prompt shared by all users. Message and
    reply lengths are uniform in `msg_len` / `reply_len`; `rate` counts conversation
    starts per second.
    """
    num_users = int_at_least(num_users, "num_users", 1)
    turns = int_at_least(turns, "turns", 1)
    system_len = int_at_least(system_len, "system_len", 0)
    msg_len = check_range("msg_len", msg_len)
    reply_len = check_range("reply_len", reply_len, lo=0)
    think_time = finite_at_least(think_time, "think_time")
    tpot = finite_at_least(tpot, "tpot")
    orate = check_rate(rate)
    vocab_size = check_vocab(vocab_size)
    conv_total, conv_largest = _conversation_size(system_len, turns, msg_len, reply_len)
    check_budget("multiturn", dict(num_users=num_users, turns=turns, system_len=system_len,
                                   msg_len=msg_len, reply_len=reply_len),
                 requests=num_users * turns, total=system_len + num_users * conv_total,
                 largest=conv_largest)

    content, timing = streams("multiturn", seed)
    system = tokens(content, system_len, vocab_size)
    convs = [conversation(content, system, turns, msg_len, reply_len, vocab_size)
             for _ in range(num_users)]
    b = Builder("multiturn", orate, dict(
        num_users=num_users, turns=turns, system_len=system_len, msg_len=msg_len,
        reply_len=reply_len, think_time=think_time, tpot=tpot, rate=rate, seed=seed,
        vocab_size=vocab_size))
    for u, (conv, start) in enumerate(zip(convs, starts(timing, num_users, orate))):
        times = turn_times(timing, start, [len(o) for _, o in conv], think_time, tpot)
        for t, ((prompt, out), at) in enumerate(zip(conv, times)):
            b.add(at, id=f"multiturn-u{u}-t{t}", prompt=prompt, output=out, session=f"u{u}")
    return b.build()


def _conversation_size(prefix: int, turns: int, msg_len: Range, reply_len: Range
                       ) -> tuple[int, int]:
    """(prompt + output tokens of one conversation, its largest request) at the longest
    messages and replies: turn t re-sends the prefix and t earlier message/reply pairs."""
    pair = msg_len[1] + reply_len[1]
    return turns * (prefix + pair) + pair * turns * (turns - 1) // 2, prefix + turns * pair
