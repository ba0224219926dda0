"""SimExecutor: a simulated GPU. A step's duration comes from the cost model; tokens come from
the workload's script (the engine asks each request for its next token), so a simulation is
deterministic and its cache behaviour is exactly what the real engine would do. A request
whose trace records only an output length gets filler ids (above any vocabulary, never
repeated, so they never hit), as the sequential replay gives it. A server that must return
text instead passes `output_ids`: unscripted requests then produce those ids in turn (one
id per token, the same sequence for every request, so a reply re-sent in the next turn of a
conversation is exactly what was produced)."""
from __future__ import annotations

from typing import Sequence

from radixkv.engine.executor import BatchPlan, StepResult
from radixkv.sched.request import FILLER_BASE
from radixkv.sim.costmodel import CostModel
from radixkv.sim.transfer import copies_time, host_link
from radixkv.sim.profile import ProfiledCostModel


class SimExecutor:
    prices_decodes = True
    def __init__(self, cost: CostModel | ProfiledCostModel, output_ids: Sequence[int] | None = None):
        if output_ids is not None and not len(output_ids):
            raise ValueError("output_ids must hold at least one id")
        self.cost = cost
        self.output_ids = None if output_ids is None else tuple(int(i) for i in output_ids)
        self.name = f"sim:{cost.label}"
        self.busy_s = 0.0
        self.link = host_link(cost.device_name)      # host-tier copies, on the step's critical path
        self.copy_s = 0.0
        self._filler = 0

    @classmethod
    def named(cls, model: str = "llama-3-8b", gpu: str = "h100-sxm") -> "SimExecutor":
        return cls(CostModel.named(model, gpu))

    def release(self, rid: str) -> None:
        return None                  # no per-request state: scripts live in the requests

    def _produce(self, req) -> int:
        if self.output_ids is not None:
            ids = self.output_ids
            return ids[len(req.output) % len(ids)]
        self._filler += 1
        return FILLER_BASE + (self._filler - 1) % FILLER_BASE

    # a run of decode steps (Engine.decode_run) prices and charges each without a plan
    def decode_step_time(self, batch: int, ctx_sum: int, ctx_max: int) -> float:
        """What run() charges for a decode-only plan of scripted requests (no copies, nothing
        sampled), to the bit: priced from len, sum and max of the contexts."""
        return self.cost.decode_step_time(batch, ctx_sum, ctx_max)

    def charge(self, dt: float) -> None:
        """Account a step priced by decode_step_time as run() would have."""
        self.busy_s += dt

    def run(self, plan: BatchPlan) -> StepResult:
        dt = self.cost.step_time([(s.prefix_len, s.n) for s in plan.extends],
                                 [s.prefix_len for s in plan.decodes])
        if plan.copies:
            copy = copies_time(plan.copies, self.link, self.cost.model_spec.kv_bytes_per_token_per_gpu)
            self.copy_s += copy
            dt += copy
        self.busy_s += dt
        tokens: list[int | None] = []
        for s in plan.segments:       # scripted requests ignore what is sampled for them
            if s.sample and s.req.forced_output is None:
                tokens.append(self._produce(s.req))
            else:
                tokens.append(None)
        return StepResult(tokens, dt)
