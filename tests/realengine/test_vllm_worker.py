"""One real vLLM CPU worker (and two), held to exact figures: a prompt sent twice hits the whole
32-token blocks before its last token (usage.prompt_tokens_details.cached_tokens), /metrics'
prefix-cache counters move by the prompt's tokens and those hits, the KV events announce the
prompt's full blocks with their token ids, under the block hashes radixkv computes for them, the
replay endpoint returns what the subscriber saw, and a worker stopped by its PID leaves no
process behind."""
from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from radixkv.kvevents.vllm_hash import block_hashes
from tests.realengine.checkpoint import COMMON, made_up_word
from tests.realengine.events import BlockRemoved, BlockStored, Event, Subscriber, replay
from tests.realengine.workers import (
    BLOCK_SIZE, KV_BYTES_PER_TOKEN, SERVED_NAME, TOPIC, VllmWorkers, Worker, alive)

FENCE_TOKENS = 64       # two whole blocks: a fresh prompt whose events close a request's


def text(seed: int, words: int = 400) -> str:
    """Pseudo-English of the checkpoint's own words, the same for the same seed."""
    rng = random.Random(seed)
    return " ".join(rng.choice(COMMON) if rng.random() < 0.5 else made_up_word(rng)
                    for _ in range(words))


def prompt_ids(w: Worker, seed: int, n: int) -> list[int]:
    """The first n token ids (BOS first) of text(seed) as the worker's /tokenize gives them."""
    r = httpx.post(f"{w.url}/tokenize", json={"model": SERVED_NAME, "prompt": text(seed)},
                   timeout=30)
    r.raise_for_status()
    ids = r.json()["tokens"]
    assert len(ids) >= n, f"text({seed}) is {len(ids)} tokens, fewer than {n}"
    return ids[:n]


def complete(w: Worker, ids: list[int]) -> dict:
    """One greedy token for a prompt of token ids; the response's usage."""
    r = httpx.post(f"{w.url}/v1/completions", timeout=120, json={
        "model": SERVED_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0})
    r.raise_for_status()
    return r.json()["usage"]


def metric(body: str, name: str) -> float:
    """A series of /metrics summed over its labels; an AssertionError naming it when absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"/metrics has no {name}"
    return sum(values)


def prefix_counters(w: Worker) -> tuple[float, float]:
    body = httpx.get(f"{w.url}/metrics", timeout=30).text
    return (metric(body, "vllm:prefix_cache_queries_total"),
            metric(body, "vllm:prefix_cache_hits_total"))


def counters_after(w: Worker, queries_before: float, tokens: int) -> tuple[float, float]:
    """The counters once the request of `tokens` is counted (the API server records a step's
    stats after it hands the step's output on, so /metrics may lag the response a moment)."""
    deadline = time.monotonic() + 10
    while True:
        queries, hits = prefix_counters(w)
        if queries >= queries_before + tokens or time.monotonic() > deadline:
            return queries, hits
        time.sleep(0.05)


def stored_before_fence(w: Worker, sub: Subscriber, mark: int, fence: list[int]) -> list[Event]:
    """Send the fresh `fence` prompt and return the events published after batch `mark` and
    before the fence's own BlockStored: those of the requests sent since `mark`."""
    complete(w, fence)
    fence_blocks = fence[: len(fence) // BLOCK_SIZE * BLOCK_SIZE]

    def fence_at() -> int | None:
        for i, e in enumerate(sub.events_after(mark)):
            if isinstance(e, BlockStored) and e.parent_block_hash is None and \
                    e.token_ids == fence_blocks:
                return i
        return None

    assert sub.wait(lambda: fence_at() is not None), \
        f"no BlockStored of the fence prompt from {w.events}: {sub.events_after(mark)}"
    return sub.events_after(mark)[: fence_at()]


@dataclass
class SentTwice:
    """What one prompt sent twice to the module's worker gave."""
    ids: list[int]
    usage: list[dict]             # the usage of the 1st send, of the 2nd
    queries: list[float]          # how far vllm:prefix_cache_queries_total moved at each send
    hits: list[float]             # how far vllm:prefix_cache_hits_total moved at each send
    events: list[list[Event]]     # the events of each send


# 200 tokens: the last block partial; 224 = 7 x 32: the last block whole, and left out of the
# hit because the hit never covers the last prompt token
@pytest.fixture(scope="module", params=[200, 224], ids=lambda n: f"{n}-tokens")
def sent_twice(request, worker: Worker, subscriber: Subscriber) -> SentTwice:
    n = request.param
    ids = prompt_ids(worker, seed=n, n=n)
    out = SentTwice(ids, [], [], [], [])
    for send in range(2):
        mark = subscriber.last_seq()
        queries, hits = prefix_counters(worker)
        out.usage.append(complete(worker, ids))
        queries_after, hits_after = counters_after(worker, queries, n)
        out.queries.append(queries_after - queries)
        out.hits.append(hits_after - hits)
        # the fence is sent once the counters are read: its own tokens are not in them
        out.events.append(stored_before_fence(worker, subscriber, mark,
                                              prompt_ids(worker, seed=1000 * n + send,
                                                         n=FENCE_TOKENS)))
    return out


def whole_blocks_before_last(n: int) -> int:
    return (n - 1) // BLOCK_SIZE * BLOCK_SIZE


def test_the_pool_is_the_bytes_asked_for(worker: Worker) -> None:
    # 8,192 tokens x 2,048 bytes asked for with --kv-cache-memory-bytes: vLLM logs the tokens
    # it made of them and /metrics reports the blocks
    assert worker.logged_kv_tokens() == 8192
    info = next(line for line in httpx.get(f"{worker.url}/metrics", timeout=30).text.splitlines()
                if line.startswith("vllm:cache_config_info{"))
    assert f'kv_cache_memory_bytes="{8192 * KV_BYTES_PER_TOKEN}"' in info
    assert 'kv_cache_size_tokens="8192"' in info
    assert f'num_gpu_blocks="{8192 // BLOCK_SIZE}"' in info
    assert f'block_size="{BLOCK_SIZE}"' in info


def test_the_second_send_hits_the_whole_blocks_before_the_last_token(
        sent_twice: SentTwice) -> None:
    n = len(sent_twice.ids)
    first, second = sent_twice.usage
    assert first["prompt_tokens"] == second["prompt_tokens"] == n
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] == whole_blocks_before_last(n)


def test_the_prefix_cache_counters_move_by_the_prompt_and_its_hits(
        sent_twice: SentTwice) -> None:
    n = len(sent_twice.ids)
    assert sent_twice.queries == [n, n]
    assert sent_twice.hits == [0, whole_blocks_before_last(n)]


def test_the_events_announce_the_full_blocks(sent_twice: SentTwice) -> None:
    ids, (first, second) = sent_twice.ids, sent_twice.events
    full = len(ids) // BLOCK_SIZE
    assert len(first) == 1 and isinstance(first[0], BlockStored), first
    hashes = first[0].block_hashes
    assert len(set(hashes)) == full
    # the first send stores every full block of the prompt, in one event, from the root
    assert first == [BlockStored(block_hashes=hashes, parent_block_hash=None,
                                 token_ids=ids[: full * BLOCK_SIZE], block_size=BLOCK_SIZE,
                                 medium="GPU")]
    # the second hits the blocks before the last token and computes the rest: a last block
    # that is whole is stored again under the same hash, chained on the block before it
    hit = whole_blocks_before_last(len(ids)) // BLOCK_SIZE
    restored = [BlockStored(block_hashes=hashes[hit:], parent_block_hash=hashes[hit - 1],
                            token_ids=ids[hit * BLOCK_SIZE: full * BLOCK_SIZE],
                            block_size=BLOCK_SIZE, medium="GPU")] if full > hit else []
    assert second == restored
    assert not any(isinstance(e, BlockRemoved) for e in first + second)


def test_radixkv_reckons_the_block_hashes_vllm_announces(sent_twice: SentTwice) -> None:
    (stored,) = sent_twice.events[0]
    assert stored.block_hashes == block_hashes(sent_twice.ids, BLOCK_SIZE)


def test_replay_returns_what_the_subscriber_received(worker: Worker,
                                                     subscriber: Subscriber) -> None:
    complete(worker, prompt_ids(worker, seed=7, n=100))
    # the worker publishes a batch at each step that stores or frees blocks: seq 0 on
    assert subscriber.wait(lambda: subscriber.batches != {})
    buffered = replay(worker.replay)
    assert sorted(buffered) == list(range(len(buffered)))
    assert subscriber.wait(lambda: subscriber.last_seq() >= max(buffered))
    assert {s: subscriber.batches[s] for s in buffered} == buffered


def _cores(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"/proc/{pid}/status has no Cpus_allowed_list")


def _port_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_a_worker_stops_by_its_pid_and_leaves_no_process(real_engine, tmp_path) -> None:
    with VllmWorkers(1, kv_tokens=8192, events=False, log_dir=tmp_path) as (w,):
        procs = w.processes()
        # the API server, the engine core and its model worker, at the least
        assert w.pid in procs and len(procs) >= 3, procs
        assert httpx.get(f"{w.url}/health", timeout=10).status_code == 200
        t0 = time.monotonic()
    stopped_s = time.monotonic() - t0
    assert not [p for p in procs if alive(p)], f"left running: {procs}"
    assert w.proc.returncode == 0, f"the API server exited with {w.proc.returncode}"
    assert stopped_s < 20, f"stopping took {stopped_s:.1f} s: SIGTERM did not end it"
    assert _port_closed(w.port)


def test_two_workers_keep_their_own_caches_and_hash_alike(real_engine, tmp_path) -> None:
    with VllmWorkers(2, kv_tokens=8192, cpus=[0, 1], log_dir=tmp_path) as ws:
        procs = {w.index: w.processes() for w in ws}
        for w in ws:
            # taskset pins the worker and everything it starts to its core
            assert {p: _cores(p) for p in procs[w.index]} == \
                {p: str(w.core) for p in procs[w.index]}
        assert [w.core for w in ws] == [0, 1]
        subs = [Subscriber(w.events, TOPIC) for w in ws]
        try:
            ids = prompt_ids(ws[0], seed=42, n=200)
            assert prompt_ids(ws[1], seed=42, n=200) == ids
            cached = [complete(ws[0], ids), complete(ws[0], ids), complete(ws[1], ids),
                      complete(ws[1], ids)]
            # the second worker starts cold: the first's cache is its own
            assert [u["prompt_tokens_details"]["cached_tokens"] for u in cached] == \
                [0, 192, 0, 192]
            full = ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]
            for sub in subs:
                assert sub.wait(lambda s=sub: any(isinstance(e, BlockStored)
                                                  for e in s.events_after(-1)))
            stored = [[e for e in sub.events_after(-1) if isinstance(e, BlockStored)]
                      for sub in subs]
            # the same prompt, the same hashes on both (sha256 of a fixed seed)
            assert len(stored[0]) == 1, stored[0]
            expected = [BlockStored(block_hashes=stored[0][0].block_hashes,
                                    parent_block_hash=None, token_ids=full,
                                    block_size=BLOCK_SIZE, medium="GPU")]
            assert len(expected[0].block_hashes) == len(full) // BLOCK_SIZE
            assert stored == [expected, expected]
        finally:
            for sub in subs:
                sub.close()
    assert not [p for w in ws for p in procs[w.index] if alive(p)], f"left running: {procs}"
