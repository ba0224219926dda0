"""SimExecutor: a simulated GPU. A step's duration comes from the cost model; tokens come from
the workload's script (the engine asks each request for its next token), so a simulation is
deterministic and its cache behaviour is exactly what the real engine would do."""
from __future__ import annotations

from radixkv.sim.costmodel import CostModel
from radixkv.engine.executor import BatchPlan, StepResult


class SimExecutor:
    def __init__(self, cost: CostModel):
        self.cost = cost
        self.name = f"sim:{cost.model_spec.name}@{cost.gpu.name}"
        self.busy_s = 0.0

    @classmethod
    def named(cls, model: str = "llama-3-8b", gpu: str = "h100-sxm") -> "SimExecutor":
        return cls(CostModel.named(model, gpu))

    def release(self, rid: str) -> None:
        return None                  # tokens come from the script: no per-request state to forget

    def run(self, plan: BatchPlan) -> StepResult:
        dt = self.cost.step_time([(s.prefix_len, s.n) for s in plan.extends],
                                 [s.prefix_len for s in plan.decodes])
        self.busy_s += dt
        return StepResult([None] * (len(plan.extends) + len(plan.decodes)), dt)
