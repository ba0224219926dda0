"""The simulated GPU's pace (server/worker.py): a step's tokens leave the engine thread at the
step's simulated end, so what a client of `radixkv serve --executor sim` measures holds the
cost model's price of its own prefill and decodes."""
import threading

from radixkv.config import EngineConfig
from radixkv.engine.engine import Engine
from radixkv.sched.request import Request
from radixkv.server.worker import EngineWorker, Update
from radixkv.sim.executor import SimExecutor


def _run(prompt_len: int, max_new: int):
    """One request through a started EngineWorker: (its arrival on the worker's clock, each
    update with the worker's clock and the engine's clock, the end of the step that made it,
    at delivery), and the engine."""
    cfg = EngineConfig(kv_capacity=8192)
    eng = Engine(cfg, cfg.cache.build(), SimExecutor.named())    # roofline Llama-3-8B, H100
    w = EngineWorker(eng, pace=True)
    got: list[tuple[float, float, Update]] = []
    done = threading.Event()

    def deliver(u: Update) -> None:                # on the engine thread, between steps
        got.append((w.now(), eng.now, u))
        if u.finish_reason is not None:
            done.set()

    req = Request("r", list(range(1, prompt_len + 1)), max_new)
    w.start()
    try:
        w.submit(req, deliver)
        assert done.wait(30), "the request never finished"
    finally:
        w.stop()
    return req.arrival, got, eng


def test_a_paced_step_hands_out_its_tokens_at_its_simulated_end():
    """Regression: the tokens were handed out before the pacing sleep, at the step's start, so
    a fresh 4,096-token prompt's first token reached the client ~170 ms before the simulated
    prefill ended and a client's TTFT held none of it."""
    arrival, got, eng = _run(4096, 3)
    prefill = eng.executor.cost.step_time([(0, 4096)], [])
    assert prefill > 0.1                                 # a price the check can see
    assert [len(u.tokens) for _, _, u in got] == [1, 1, 1]
    assert got[-1][2].finish_reason == "length"
    for wall, step_end, _ in got:                        # each update at its step's end or later
        assert wall >= step_end - 1e-6, (wall, step_end)
    assert got[0][0] - arrival >= prefill - 1e-6        # the first token after the prefill
    assert eng.steps == 3

