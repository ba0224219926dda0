"""The executor protocol: run one BatchPlan, return the produced tokens and the step's duration.

The scheduler and engine never know which executor runs: SimExecutor prices the plan with a
cost model; TorchExecutor runs a model over the paged KV pool.
"""
from __future__ import annotations

from typing import Protocol

from radixkv.sched.batch import BatchPlan, Segment, StepResult

__all__ = ["BatchPlan", "Executor", "Segment", "StepResult"]


class Executor(Protocol):
    name: str
    # True: it also prices a decode-only step of scripted requests without a plan
    # (decode_step_time(batch, ctx_sum, ctx_max) -> seconds, then charge(seconds)), so the
    # engine may run such steps in a row without building plans (Engine.decode_run)
    prices_decodes: bool

    def run(self, plan: BatchPlan) -> StepResult:
        """Compute every segment's KV (written at its ctx_slots) and sample where asked."""
        ...

    def release(self, rid: str) -> None:
        """Forget the per-request state (sampling generators, ...) of a finished or aborted
        request."""
        ...
