"""Per-request sampling: greedy, temperature, top-k, top-p; reproducible given a seed.

Each sampled row draws exactly one uniform from its own request's CPU generator per step,
so a request's tokens do not depend on which other requests share its batch, nor on the
device the logits live on (up to floating-point differences in the logits themselves).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from radixkv.argcheck import finite_at_least, int_at_least, is_int, positive_fraction


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0               # 0 -> greedy (argmax)
    top_p: float = 1.0                     # nucleus mass kept, in (0, 1]
    top_k: int = 0                         # 0 -> no top-k cut
    seed: int | None = None                # None -> the global torch RNG
    max_new_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        finite_at_least(self.temperature, "temperature", 0)
        positive_fraction(self.top_p, "top_p")
        if not is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or self.seed < 0):
            raise ValueError(f"seed must be None or an int >= 0, got {self.seed!r}")
        int_at_least(self.max_new_tokens, "max_new_tokens", 1)
        if isinstance(self.stop_token_ids, (str, bytes)) or not isinstance(self.stop_token_ids, Iterable):
            raise ValueError(f"stop_token_ids must be a sequence of ints, got {self.stop_token_ids!r}")
        stops = tuple(self.stop_token_ids)
        bad = [s for s in stops if not is_int(s) or s < 0]
        if bad:
            raise ValueError(f"stop_token_ids must be ints >= 0, got {bad[0]!r}")
        object.__setattr__(self, "top_k", int(self.top_k))
        object.__setattr__(self, "seed", None if self.seed is None else int(self.seed))
        object.__setattr__(self, "max_new_tokens", int(self.max_new_tokens))
        object.__setattr__(self, "stop_token_ids", tuple(int(s) for s in stops))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def make_generator(self) -> torch.Generator | None:
        """A fresh CPU generator for one request (None when unseeded)."""
        return None if self.seed is None else torch.Generator().manual_seed(self.seed)


def sample(logits: Tensor, params_list: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None] | None = None) -> Tensor:
    """logits [B, V] -> token ids LongTensor [B] on logits.device.

    generators[b] is request b's CPU generator (advanced by one draw per sampled step);
    None uses the global RNG. Greedy rows draw nothing.
    """
    B, V = logits.shape
    if len(params_list) != B:
        raise ValueError(f"sample: {B} logit rows but {len(params_list)} SamplingParams")
    generators = list(generators) if generators is not None else [None] * B
    if len(generators) != B:
        raise ValueError(f"sample: {B} logit rows but {len(generators)} generators")
    logits = logits.float()
    greedy_ids = logits.argmax(dim=-1)
    rows = [b for b, p in enumerate(params_list) if not p.greedy]
    if not rows:
        return greedy_ids
    dev = logits.device
    ps = [params_list[b] for b in rows]
    temp = torch.tensor([p.temperature for p in ps], device=dev)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < V else V for p in ps], device=dev)
    top_p = torch.tensor([p.top_p for p in ps], device=dev)
    u = torch.cat([torch.rand(1, generator=g) if g is not None else torch.rand(1) for g in
                   (generators[b] for b in rows)]).to(dev)                       # [R] one draw per row
    sorted_logits, sorted_ids = (logits[rows] / temp[:, None]).sort(dim=-1, descending=True)  # [R, V]
    ranks = torch.arange(V, device=dev)[None, :]
    sorted_logits = sorted_logits.masked_fill(ranks >= top_k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Nucleus: keep the smallest head whose mass reaches top_p (the first token always stays).
    drop = ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (top_p[:, None] < 1)
    cdf = probs.masked_fill(drop, 0.0).cumsum(dim=-1)                            # [R, V]
    # Inverse CDF: first rank whose cumulative mass exceeds u * total (zero-mass ranks never win).
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(max=V - 1)
    out = greedy_ids.clone()
    out[rows] = sorted_ids.gather(1, pick).squeeze(1)
    return out
