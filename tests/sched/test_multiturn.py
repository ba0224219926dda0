"""Turn 5 of a conversation hits all of turn 4's prompt and its whole reply.

A scripted request ends by sampling its stop token, and the decode step that samples it
computes the KV of the last reply token: at finish every reply token has KV, and the tree
holds prompt + reply (rounded down to whole pages).
"""
from __future__ import annotations

import pytest

from radixkv.config import CacheConfig, SchedulerConfig
from radixkv.sched.request import Request, Status

from ._helpers import make_engine, toks

PROMPT4, REPLY, MSG = 4300, 300, 120


@pytest.mark.parametrize("cache, hit", [
    (CacheConfig("radix", 1), PROMPT4 + REPLY),                        # 4,600
    (CacheConfig("radix", 16), (PROMPT4 + REPLY) // 16 * 16),          # 4,592 = 287 pages
    (CacheConfig("blockhash", 16), (PROMPT4 + REPLY) // 16 * 16),
], ids=["radix-p1", "radix-p16", "blockhash16"])
def test_turn5_hits_turn4_prompt_and_reply(cache, hit):
    prompt4 = toks(10_000, PROMPT4)
    reply = toks(20_000, REPLY)
    prompt5 = prompt4 + reply + toks(30_000, MSG)
    eng = make_engine(6_000, cache, SchedulerConfig(), check=True)
    t4 = eng.add_request(Request("u0-t4", prompt4, 0, forced_output=reply, index=0))
    t5 = eng.add_request(Request("u0-t5", prompt5, 0, forced_output=toks(40_000, 10),
                                 arrival=1000.0, index=1))
    assert t4.max_new_tokens == REPLY + 1                 # the reply, then the stop
    eng.run_until_idle()
    assert t4.status is Status.FINISHED and t5.status is Status.FINISHED
    assert t4.finish_time < t5.arrival == t5.first_admit  # turn 4 was done when turn 5 arrived
    assert t4.output == reply
    assert t4.cached_tokens == 0 and t4.prefill_tokens == PROMPT4
    assert t5.cached_tokens == hit
    assert t5.prefill_tokens == len(prompt5) - hit
    if cache.page_size == 1:
        assert (t5.cached_tokens, t5.prefill_tokens) == (4600, 120)
    # turn 4 decoded exactly 300 steps: 299 to produce reply[1:], 1 that computes reply[-1]'s
    # KV and samples the stop
    decodes_t4 = [seg for step in eng.executor.steps for seg in step
                  if seg[0] == "u0-t4" and seg[4] == "decode"]
    assert len(decodes_t4) == REPLY
    assert [seg[1] for seg in decodes_t4] == list(range(PROMPT4, PROMPT4 + REPLY))


def test_turn5_sent_before_turn4_finished_hits_prompt_only():
    """Turn 5 sent while turn 4 still runs (as a misbehaving client would): the reply is not
    in the tree yet, only turn 4's prompt is (inserted when its prefill completed)."""
    prompt4 = toks(10_000, PROMPT4)
    reply = toks(20_000, REPLY)
    prompt5 = prompt4 + reply + toks(30_000, MSG)
    eng = make_engine(6_000, CacheConfig(), SchedulerConfig(), check=True)
    t4 = eng.add_request(Request("t4", prompt4, 0, forced_output=reply, index=0))
    t5 = eng.add_request(Request("t5", prompt5, 0, forced_output=(), index=1))
    eng.run_until_idle()
    assert t4.output == reply and t5.output == []
    # t5 shares PROMPT4 - 1 tokens of t4's match key in-batch: dedup holds it back one round,
    # then it hits the whole of turn 4's prompt
    assert eng.sched.counters.held_back == 1
    assert t5.cached_tokens == PROMPT4
    assert t5.prefill_tokens == REPLY + MSG
