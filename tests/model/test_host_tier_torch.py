"""The host tier on the real engine: evicted prefixes are copied to a host buffer and loaded
back, and a run that hits them gives exactly (torch.equal) the logits of a run without a cache
(batch-invariant attention, fp32, greedy). Spoiling the host buffer before each load changes
them: every host hit was loaded and used."""
from __future__ import annotations

import pytest
import torch

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.engine.engine import Engine
from radixkv.model.executor import TorchExecutor
from radixkv.model.model import Transformer
from radixkv.model.sampling import SamplingParams
from radixkv.sched.request import Request
from tests.model.test_torch_engine import ARGS, NEW, handmade_waves

CAPACITY = 512


@pytest.fixture(scope="module")
def weights() -> dict:
    return Transformer(ARGS).init_random(seed=1, std=0.05).state_dict()


def waves():
    w = handmade_waves()
    return w + [[(f"{rid}-again", prompt) for rid, prompt in w[0]]]


def run(weights, cache: CacheConfig, spoil: bool = False):
    torch.set_num_threads(1)
    model = Transformer(ARGS)
    model.load_state_dict(weights)
    cfg = EngineConfig(kv_capacity=CAPACITY, cache=cache,
                       sched=SchedulerConfig(chunked_prefill_size=0), check_invariants=True)
    ex = TorchExecutor(model, ARGS, CAPACITY, device="cpu", dtype=torch.float32,
                       batch_invariant=True, host_slots=cache.host_kv_tokens)
    ex.keep_logits = True
    if spoil:                                       # zero the host rows each load reads
        copy = ex.kv.run_copies

        def spoiled(host, copies):
            for c in copies:
                if c.kind == "load":
                    host.buf[:, :, torch.as_tensor(c.host)] = 0.0
            copy(host, copies)
        ex.kv.run_copies = spoiled
    engine = Engine(cfg, cache.build(), ex)
    for wave in waves():
        for rid, prompt in wave:
            engine.add_request(Request(rid, prompt, NEW, arrival=engine.now,
                                       sampling=SamplingParams(), index=len(engine.requests)))
        engine.run_until_idle()
    return engine, dict(ex.last_logits)


def test_host_hits_are_loaded_and_used(weights):
    _, ref = run(weights, CacheConfig("none"))
    for policy in ("write_back", "write_through"):
        cache = CacheConfig("radix", host_kv_tokens=4 * CAPACITY, host_write_policy=policy)
        engine, logits = run(weights, cache)
        hits = sum(r.host_hit_tokens for r in engine.finished)
        assert hits > 0 and engine.cache.stats()["host_loaded_tokens"] >= hits, policy
        for rid, lg in ref.items():
            assert torch.equal(logits[rid], lg), (policy, rid)
    _, spoiled = run(weights, cache, spoil=True)
    assert any(not torch.equal(spoiled[rid], lg) for rid, lg in ref.items())
