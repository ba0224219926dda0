"""SimExecutor: a simulated GPU. A step's duration comes from the cost model; tokens come from
the workload's script (the engine asks each request for its next token), so a simulation is
deterministic and its cache behaviour is exactly what the real engine would do. A request
whose trace records only an output length gets filler ids (above any vocabulary, never
repeated, so they never hit), as the sequential replay gives it."""
from __future__ import annotations

from radixkv.engine.executor import BatchPlan, StepResult
from radixkv.sched.request import FILLER_BASE
from radixkv.sim.costmodel import CostModel


class SimExecutor:
    def __init__(self, cost: CostModel):
        self.cost = cost
        self.name = f"sim:{cost.model_spec.name}@{cost.gpu.name}"
        self.busy_s = 0.0
        self._filler = 0

    @classmethod
    def named(cls, model: str = "llama-3-8b", gpu: str = "h100-sxm") -> "SimExecutor":
        return cls(CostModel.named(model, gpu))

    def release(self, rid: str) -> None:
        return None                  # no per-request state: scripts live in the requests

    def run(self, plan: BatchPlan) -> StepResult:
        dt = self.cost.step_time([(s.prefix_len, s.n) for s in plan.extends],
                                 [s.prefix_len for s in plan.decodes])
        self.busy_s += dt
        tokens: list[int | None] = []
        for s in plan.segments:       # scripted requests ignore what is sampled for them
            if s.sample and s.req.forced_output is None:
                tokens.append(FILLER_BASE + self._filler % FILLER_BASE)
                self._filler += 1
            else:
                tokens.append(None)
        return StepResult(tokens, dt)
