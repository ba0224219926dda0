"""The real engine: Engine + TorchExecutor (tiny-llama, fp32, greedy, batch-invariant).

With the radix cache on, every greedy output and every request's final logits are exactly
equal (torch.equal) to a NoCache run of the same requests: reusing a prefix, splitting an
edge mid-way, chunking a prompt or retracting and re-admitting a request changes which
forward computes a token's KV, never its bits. Slots are conserved after every step.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from radixkv.config import CacheConfig, EngineConfig, SchedulerConfig
from radixkv.engine.engine import Engine
from radixkv.engine.executor import BatchPlan, Segment
from radixkv.model.executor import TorchExecutor
from radixkv.model.model import Transformer
from radixkv.shapes import get_model_config
from radixkv.model.sampling import SamplingParams
from radixkv.sched.request import Request
from radixkv.workloads import make_workload

ARGS = get_model_config("tiny-llama")
NEW = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)          # overhead-bound tiny model; steady on a shared CPU
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def weights() -> dict:
    # std 0.05 keeps logits O(1) so greedy outputs depend on the context.
    return Transformer(ARGS).init_random(seed=1, std=0.05).state_dict()


def handmade_waves() -> list[list[tuple[str, list[int]]]]:
    """Prompts that share long prefixes and diverge mid-edge, in three waves."""
    rng = np.random.default_rng(7)
    t = lambda n: rng.integers(0, ARGS.vocab_size, n).tolist()  # noqa: E731
    S, a, b = t(150), t(90), t(70)
    return [
        [("A", S + a), ("B", S + b)],
        [("C", S + a[:45] + t(40)),            # splits A's edge in the middle
         ("D", S[:101] + t(60)),               # splits the shared system prompt
         ("E", S + a + t(25))],                # extends A's prompt (not its output)
        [("F", S + a[:45] + t(33)),
         ("G", S[:37] + t(20))],
    ]


def support_waves() -> list[list[tuple[str, list[int]]]]:
    """The support agent, scaled down: sampled replies differ from the recorded ones, so each
    later turn diverges from the tree exactly where the earlier turn's reply starts."""
    wl = make_workload("support", num_users=3, turns=2, system_len=64, fewshot_len=96, rag_len=48,
                       msg_len=(8, 24), reply_len=(4, 12), vocab_size=ARGS.vocab_size)
    turns: dict[int, list] = {}
    for r in wl:
        turn = int(r.id.rsplit("-t", 1)[1]) if "-t" in r.id else 0      # RAG requests go first
        turns.setdefault(turn, []).append((r.id, list(r.prompt)))
    return [turns[k] for k in sorted(turns)]


WAVES = {"handmade": handmade_waves, "support": support_waves}


class Run:
    """One engine run over waves (each wave runs to idle before the next arrives)."""

    def __init__(self, weights, waves, kind: str, page: int = 1, chunk: int = 0,
                 capacity: int = 8192, **sched):
        model = Transformer(ARGS)
        model.load_state_dict(weights)
        self.cfg = EngineConfig(kv_capacity=capacity, cache=CacheConfig(kind, page),
                                sched=SchedulerConfig(chunked_prefill_size=chunk, **sched),
                                check_invariants=True)
        self.ex = TorchExecutor(model, ARGS, capacity, device="cpu", dtype=torch.float32,
                                batch_invariant=True)
        self.ex.keep_logits = True
        self.cache = self.cfg.cache.build()
        self.splits = 0
        if hasattr(self.cache, "_split"):
            split = self.cache._split

            def counting_split(*a):
                self.splits += 1
                return split(*a)
            self.cache._split = counting_split
        self.engine = Engine(self.cfg, self.cache, self.ex)
        self.chunks = 0
        run = self.ex.run

        def counting_run(plan):
            self.chunks += sum(not s.sample for s in plan.extends)
            return run(plan)
        self.ex.run = counting_run
        for wave in waves:
            for rid, prompt in wave:
                self.engine.add_request(Request(rid, prompt, NEW, arrival=self.engine.now,
                                                sampling=SamplingParams(),
                                                index=len(self.engine.requests)))
            self.report = self.engine.run_until_idle()
        self.outputs = {r.rid: list(r.output) for r in self.engine.finished}
        self.logits = dict(self.ex.last_logits)


_REFS: dict = {}


def reference(weights, name: str) -> Run:
    if name not in _REFS:
        _REFS[name] = Run(weights, WAVES[name](), "none")
    return _REFS[name]


def assert_same(run: Run, ref: Run) -> None:
    assert set(run.outputs) == set(ref.outputs)
    for rid, out in ref.outputs.items():
        assert len(out) == NEW and run.outputs[rid] == out, rid
        assert torch.equal(run.logits[rid], ref.logits[rid]), rid
    run.engine.pool.check_conservation(run.cache.held_slots())
    run.cache.check_invariants()
    assert run.engine.pool.used() == run.cache.total_size()


@pytest.mark.parametrize("chunk", [0, 48])
@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("name", sorted(WAVES))
def test_radix_matches_no_cache_exactly(weights, name, page, chunk):
    ref = reference(weights, name)
    assert ref.report.cached_tokens == 0 and ref.report.retractions == 0
    run = Run(weights, WAVES[name](), "radix", page=page, chunk=chunk)
    assert_same(run, ref)
    assert run.report.cached_tokens > 0 and run.splits > 0
    assert run.report.prefill_tokens < ref.report.prefill_tokens
    assert (run.chunks > 0) == (chunk > 0)


@pytest.mark.parametrize("page", [1, 16])
def test_retraction_and_readmission_keep_outputs(weights, page):
    ref = reference(weights, "handmade")
    # A tight pool and a low decode reservation: admission over-commits, decode retracts.
    run = Run(weights, handmade_waves(), "radix", page=page, chunk=32, capacity=288,
              init_new_token_ratio=0.0, min_new_token_ratio=0.0, max_prefill_tokens=256)
    assert run.report.retractions > 0
    assert sum(r.recomputed_tokens for r in run.report.records) > 0
    assert_same(run, ref)
    assert all(len(r.output) == NEW for r in run.engine.finished)


def test_blockhash_matches_no_cache_exactly(weights):
    ref = reference(weights, "handmade")
    run = Run(weights, handmade_waves(), "blockhash", page=16)
    assert_same(run, ref)
    assert run.report.cached_tokens > 0


def test_executor_plan_shape_and_generators():
    ex = TorchExecutor.from_config("tiny-llama", 256, seed=0, device="cpu")
    assert ex.dtype == torch.float32 and ex.kv.num_slots == 256

    class R:
        def __init__(self, rid, sampling=None):
            self.rid, self.sampling = rid, sampling
    hot = SamplingParams(temperature=1.0, seed=3)
    plan = BatchPlan(extends=[Segment(R("x"), 0, [1, 2, 3], np.arange(3), True),
                              Segment(R("y", hot), 0, [4, 5], np.arange(10, 12), False)],
                     decodes=[Segment(R("z", hot), 0, [7], np.array([20]), True)])
    res = ex.run(plan)
    assert len(res.tokens) == 3 and res.tokens[1] is None and res.duration > 0
    assert all(0 <= t < ARGS.vocab_size for t in (res.tokens[0], res.tokens[2]))
    assert set(ex.generators) == {"x", "z"} and ex.generators["x"] is None
    ex.release("z")
    assert set(ex.generators) == {"x"}
    with pytest.raises(ValueError, match="outside the model vocabulary"):
        ex.run(BatchPlan(extends=[Segment(R("w"), 0, [ARGS.vocab_size], np.arange(30, 31), True)]))
    with pytest.raises(ValueError, match="unknown model"):
        TorchExecutor.from_config("no-such-model", 16, device="cpu")
