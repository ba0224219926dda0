"""What one engine step computes: a BatchPlan of Segments, and the executor's StepResult.

Each segment computes the KV of `input_ids` at the end of a context whose first `prefix_len`
tokens already have KV (cached prefix or earlier chunks):

    ctx_slots = [ prefix (prefix_len) | new (len(input_ids)) ]   # KV slot of every context token

A decode is a segment with one input token. The scheduler builds plans; executors run them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import numpy as np


@dataclass(slots=True)
class Segment:
    req: Any                  # the scheduler's Request (rid, sampling parameters)
    prefix_len: int
    input_ids: Sequence[int]  # [n] new tokens
    ctx_slots: np.ndarray     # [prefix_len + n]
    sample: bool              # produce the next token from the last position

    @property
    def n(self) -> int:
        return len(self.input_ids)


@dataclass(slots=True)
class BatchPlan:
    extends: list[Segment] = field(default_factory=list)    # prefill / extend chunks
    decodes: list[Segment] = field(default_factory=list)    # one token each
    copies: list = field(default_factory=list)      # host-tier copies to run first, in order

    def __bool__(self) -> bool:
        return bool(self.extends or self.decodes)

    @property
    def segments(self) -> list[Segment]:
        return self.extends + self.decodes

    @property
    def num_extend_tokens(self) -> int:
        return sum(s.n for s in self.extends)


class StepResult(NamedTuple):
    tokens: list[int | None]  # aligned with plan.segments; None where nothing was sampled
    duration: float           # seconds the step took (simulated or measured)
