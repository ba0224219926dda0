"""Shared-prefix generators: few-shot preamble, cold burst, tree of thought, RAG pool.

`rate` is requests per second with Poisson arrivals (for `tree`: tree roots per second);
rate None (or inf) puts every arrival at 0 and keeps the timed schedule's order.
"""
from __future__ import annotations

import numpy as np

from radixkv.argcheck import finite_at_least, int_at_least

from ._common import (Builder, Range, check_budget, check_range, check_rate, check_vocab,
                      length, starts, streams, tokens)
from .record import MAX_WORKLOAD_REQUESTS, Workload


def fewshot(num_questions: int = 500, preamble_len: int = 4000,
            question_len: Range = (20, 200), output_len: Range = (50, 200),
            rate: float | None = None, seed: int = 0, vocab_size: int = 32000) -> Workload:
    """Independent questions behind one long shared preamble: prompt = P + question."""
    num_questions = int_at_least(num_questions, "num_questions", 1)
    preamble_len = int_at_least(preamble_len, "preamble_len", 1)
    question_len = check_range("question_len", question_len)
    output_len = check_range("output_len", output_len, lo=0)
    orate = check_rate(rate)
    vocab_size = check_vocab(vocab_size)
    req = preamble_len + question_len[1] + output_len[1]
    check_budget("fewshot", dict(num_questions=num_questions, preamble_len=preamble_len,
                                 question_len=question_len, output_len=output_len),
                 requests=num_questions, total=preamble_len + num_questions * req, largest=req)
    content, timing = streams("fewshot", seed)
    preamble = tokens(content, preamble_len, vocab_size)
    b = Builder("fewshot", orate, dict(
        num_questions=num_questions, preamble_len=preamble_len, question_len=question_len,
        output_len=output_len, rate=rate, seed=seed, vocab_size=vocab_size))
    for i, at in enumerate(starts(timing, num_questions, orate)):
        q = tokens(content, length(content, question_len), vocab_size)
        out = tokens(content, length(content, output_len), vocab_size)
        b.add(at, id=f"fewshot-{i}", prompt=preamble + q, output=out)
    return b.build()


def burst(num_requests: int = 64, prefix_len: int = 2000, suffix_len: int = 32,
          output_len: Range = (8, 32), rate: float | None = None, seed: int = 0,
          vocab_size: int = 32000) -> Workload:
    """`num_requests` requests sharing one cold `prefix_len`-token prefix, each with its own
    `suffix_len`-token suffix and a short output; by default all arrive at t=0, the case
    where in-batch prefix dedup matters (nothing is cached yet)."""
    num_requests = int_at_least(num_requests, "num_requests", 1)
    prefix_len = int_at_least(prefix_len, "prefix_len", 0)
    suffix_len = int_at_least(suffix_len, "suffix_len", 0 if prefix_len else 1)
    output_len = check_range("output_len", output_len, lo=0)
    orate = check_rate(rate)
    vocab_size = check_vocab(vocab_size)
    req = prefix_len + suffix_len + output_len[1]
    check_budget("burst", dict(num_requests=num_requests, prefix_len=prefix_len,
                               suffix_len=suffix_len, output_len=output_len),
                 requests=num_requests, total=prefix_len + num_requests * req, largest=req)
    content, timing = streams("burst", seed)
    prefix = tokens(content, prefix_len, vocab_size)
    b = Builder("burst", orate, dict(
        num_requests=num_requests, prefix_len=prefix_len, suffix_len=suffix_len,
        output_len=output_len, rate=rate, seed=seed, vocab_size=vocab_size))
    for i, at in enumerate(starts(timing, num_requests, orate)):
        suffix = tokens(content, suffix_len, vocab_size)
        out = tokens(content, length(content, output_len), vocab_size)
        b.add(at, id=f"burst-{i}", prompt=prefix + suffix, output=out)
    return b.build()


def tree(num_trees: int = 4, branching: int = 3, depth: int = 3, root_len: int = 1000,
         instruction_len: Range = (16, 48), reply_len: Range = (100, 300),
         tpot: float = 0.02, rate: float | None = None, seed: int = 0,
         vocab_size: int = 32000) -> Workload:
    """Tree-of-thought branching: each tree is a root problem prompt (`root_len` tokens);
    every node has `branching` children down to `depth`, and a child's prompt is its
    parent's prompt + the parent's reply + a branch instruction. A node is one request, so
    a tree has 1 + b + ... + b**depth requests (40 with the defaults, 160 in all).

    Roots arrive as a Poisson process at `rate` trees/s; a child arrives when its parent's
    reply is done (parent arrival + reply length x `tpot`), so parents precede children.
    Node ids read `tree<t>-r.<i>.<j>...`, the path of child indices from the root.
    """
    num_trees = int_at_least(num_trees, "num_trees", 1)
    branching = int_at_least(branching, "branching", 1)
    depth = int_at_least(depth, "depth", 0)
    root_len = int_at_least(root_len, "root_len", 1)
    instruction_len = check_range("instruction_len", instruction_len)
    reply_len = check_range("reply_len", reply_len, lo=0)
    tpot = finite_at_least(tpot, "tpot")
    orate = check_rate(rate)
    vocab_size = check_vocab(vocab_size)
    _check_tree_budget(num_trees, branching, depth, root_len, instruction_len, reply_len)
    content, timing = streams("tree", seed)
    b = Builder("tree", orate, dict(
        num_trees=num_trees, branching=branching, depth=depth, root_len=root_len,
        instruction_len=instruction_len, reply_len=reply_len, tpot=tpot, rate=rate,
        seed=seed, vocab_size=vocab_size))
    for t, start in enumerate(starts(timing, num_trees, orate)):
        # Breadth-first: a level's prompts extend the previous level's prompt + reply.
        level = [("r", tokens(content, root_len, vocab_size), start)]
        for d in range(depth + 1):
            nxt = []
            for path, prompt, at in level:
                reply = tokens(content, length(content, reply_len), vocab_size)
                b.add(at, id=f"tree{t}-{path}", prompt=prompt, output=reply,
                      session=f"tree{t}")
                if d < depth:
                    done = at + len(reply) * tpot
                    for c in range(branching):
                        instr = tokens(content, length(content, instruction_len), vocab_size)
                        nxt.append((f"{path}.{c}", prompt + reply + instr, done))
            level = nxt
    return b.build()


def _check_tree_budget(num_trees: int, branching: int, depth: int, root_len: int,
                       instruction_len: Range, reply_len: Range) -> None:
    """A node at depth d has a prompt of at most root_len + d x (reply + instruction) tokens
    and b**d nodes share that depth."""
    step, reply = reply_len[1] + instruction_len[1], reply_len[1]
    # Past 62 levels a binary tree alone has more than 2**62 nodes: summing further would
    # only build huge ints for a refusal that is already certain.
    levels = depth if branching == 1 else min(depth, 62)
    if branching == 1:
        nodes = depth + 1
        per_tree = nodes * (root_len + reply) + step * depth * (depth + 1) // 2
    else:
        nodes = per_tree = 0
        for d in range(levels + 1):
            nodes += branching ** d
            per_tree += branching ** d * (root_len + d * step + reply)
    check_budget("tree", dict(num_trees=num_trees, branching=branching, depth=depth,
                              root_len=root_len, instruction_len=instruction_len,
                              reply_len=reply_len),
                 requests=num_trees * nodes, total=num_trees * per_tree,
                 largest=root_len + depth * step + reply, at_least=levels < depth)


def rag(num_requests: int = 500, num_docs: int = 200, doc_len: int = 2000,
        docs_per_request: int = 3, zipf_s: float = 1.1, system_len: int = 256,
        question_len: Range = (16, 64), output_len: Range = (50, 200),
        rate: float | None = None, seed: int = 0, vocab_size: int = 32000) -> Workload:
    """Retrieval-augmented requests over a pool of `num_docs` documents of `doc_len` tokens.

    prompt = system prompt + k = `docs_per_request` distinct documents + question. Document
    popularity is Zipf: the document of popularity rank r is drawn with weight 1/r**zipf_s
    (ranks assigned to documents by a seeded shuffle). The k documents appear in draw
    order, the retriever's ranking, and order matters: two requests share KV only up to
    their first differing document.
    """
    num_requests = int_at_least(num_requests, "num_requests", 1)
    num_docs = int_at_least(num_docs, "num_docs", 1)
    doc_len = int_at_least(doc_len, "doc_len", 1)
    docs_per_request = int_at_least(docs_per_request, "docs_per_request", 1)
    if docs_per_request > num_docs:
        raise ValueError(f"docs_per_request {docs_per_request} > num_docs {num_docs}")
    zipf_s = finite_at_least(zipf_s, "zipf_s")
    system_len = int_at_least(system_len, "system_len", 0)
    question_len = check_range("question_len", question_len)
    output_len = check_range("output_len", output_len, lo=0)
    orate = check_rate(rate)
    vocab_size = check_vocab(vocab_size)
    if num_docs > MAX_WORKLOAD_REQUESTS:
        raise ValueError(f"rag: num_docs={num_docs!r} is over the bound of "
                         f"{MAX_WORKLOAD_REQUESTS:,} (2**24) documents")
    req = system_len + docs_per_request * doc_len + question_len[1] + output_len[1]
    check_budget("rag", dict(num_requests=num_requests, num_docs=num_docs, doc_len=doc_len,
                             docs_per_request=docs_per_request, system_len=system_len,
                             question_len=question_len, output_len=output_len),
                 requests=num_requests,
                 total=system_len + num_docs * doc_len + num_requests * req, largest=req)
    content, timing = streams("rag", seed)
    system = tokens(content, system_len, vocab_size)
    docs = [tokens(content, doc_len, vocab_size) for _ in range(num_docs)]
    weights = 1.0 / np.arange(1, num_docs + 1) ** zipf_s
    popularity = np.empty(num_docs)
    popularity[content.permutation(num_docs)] = weights / weights.sum()
    b = Builder("rag", orate, dict(
        num_requests=num_requests, num_docs=num_docs, doc_len=doc_len,
        docs_per_request=docs_per_request, zipf_s=zipf_s, system_len=system_len,
        question_len=question_len, output_len=output_len, rate=rate, seed=seed,
        vocab_size=vocab_size))
    for i, at in enumerate(starts(timing, num_requests, orate)):
        picked = content.choice(num_docs, size=docs_per_request, replace=False, p=popularity)
        prompt = system + sum((docs[j] for j in picked.tolist()), ())
        prompt += tokens(content, length(content, question_len), vocab_size)
        out = tokens(content, length(content, output_len), vocab_size)
        b.add(at, id=f"rag-{i}", prompt=prompt, output=out)
    return b.build()
