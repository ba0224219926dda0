"""The step price of a disaggregated decode worker: its requests arrive with their prompt's KV
already computed (sent by a prefill worker), so a prompt it admits costs one token's forward
over the whole prompt in the batch it joins, as vLLM's decode worker recomputes only the last
prompt token of a request whose KV it pulled (NixlConnector), and SGLang's decode worker starts
from the prefill's first token.

Every step is therefore a decode step of the underlying model: a segment (p, n) of n tokens
after p cached ones is priced as a decode with a context of p + n - 1.
"""
from __future__ import annotations

from collections.abc import Sequence


class DecodeWorkerCost:
    """A cost model (CostModel, MeasuredCostModel or a profile's) seen from a decode worker."""

    def __init__(self, cost):
        self.inner = cost
        self.model_spec = cost.model_spec

    @property
    def label(self) -> str:
        return f"{self.inner.label} decode worker"

    @property
    def device_name(self) -> str:
        return self.inner.device_name

    @property
    def timing(self) -> str:
        return self.inner.timing

    def step_time(self, prefill_segments: Sequence[tuple[int, int]] = (),
                  decode_context_lens: Sequence[int] = ()) -> float:
        ctx = list(decode_context_lens)
        ctx += [p + n - 1 for p, n in prefill_segments]
        return self.inner.step_time((), ctx)

    def decode_step_time(self, batch: int, ctx_sum: int, ctx_max: int) -> float:
        return self.inner.decode_step_time(batch, ctx_sum, ctx_max)
