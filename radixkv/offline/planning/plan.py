"""The search of `radixkv plan`: the cheapest simulated deployments that meet the SLOs.

Every family (planning/space.py) is sized by simulation on the whole trace, with two rules to
skip what cannot win:
- curves (planning/bounds.py): a pool too small to keep up even at the best hit rate its
  memory allows is not simulated;
- monotonicity: more replicas never hurt an SLO already met, so an aggregated family's
  smallest passing size is found by bisection; a disaggregated one walks its prefill workers
  upward, bisecting the fewest decode workers for each (never more than the last passing
  count), and stops once one more prefill worker cannot be cheaper than what passed.
The recommendations are the `keep` cheapest families' smallest passing sizes (`recommend`);
a size no cheaper than the `keep`-th of those found so far is not simulated either. Families advance together, one probe each per round, and each round's probes run as
one batch (planning/runner.py), so the outcome depends only on the inputs.

Cost: GPU-hours (GPUs x the simulated makespan) times the GPU's price per hour (1 unless one
is given), so that different GPUs compare.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from radixkv.offline.planning.bounds import Bounds
from radixkv.offline.planning.runner import Job, Outcome
from radixkv.offline.planning.space import Candidate, Family, Setting
from radixkv.argcheck import positive_number


@dataclass(frozen=True)
class SLO:
    """The targets a deployment must meet, in seconds; a target not given (None) is not
    checked, and at least one must be given."""
    ttft_p99: float | None = None
    itl_p99: float | None = None
    e2e_p99: float | None = None

    def __post_init__(self):
        given = self.targets()
        if not given:
            raise ValueError("give at least one SLO: --ttft-p99, --itl-p99 or --e2e-p99")
        for flag, bound in given:
            positive_number(bound, flag)

    def targets(self) -> list[tuple[str, float]]:
        """(flag, seconds) of every target given."""
        return [(flag, bound) for flag, bound in (("--ttft-p99", self.ttft_p99),
                                                  ("--itl-p99", self.itl_p99),
                                                  ("--e2e-p99", self.e2e_p99))
                if bound is not None]

    def describe(self) -> str:
        """'TTFT p99 <= 2 s, ITL p99 <= 0.05 s' over the targets given."""
        names = {"--ttft-p99": "TTFT p99", "--itl-p99": "ITL p99", "--e2e-p99": "E2E p99"}
        return ", ".join(f"{names[flag]} ≤ {bound:g} s" for flag, bound in self.targets())

    def meets(self, o: Outcome) -> bool:
        got = {"--ttft-p99": o.ttft_p99, "--itl-p99": o.itl_p99, "--e2e-p99": o.e2e_p99}
        return all(got[flag] is not None and got[flag] <= bound
                   for flag, bound in self.targets())


class Row(NamedTuple):
    candidate: Candidate
    outcome: Outcome
    meets: bool
    gpu_hours: float
    cost: float

    def key(self) -> tuple:
        """Cheapest first; then fewer GPUs, lower TTFT p99, and the candidate's own order."""
        return (self.cost, self.candidate.gpus, self.outcome.ttft_p99 or float("inf"),
                self.candidate)


class Sizing:
    """One family's search: `probe()` names the next size to simulate (None: done), `seen(row)`
    takes its outcome."""

    def __init__(self, fam: Family, most_workers: int, bounds: Bounds):
        self.fam, self.most, self.bounds = fam, most_workers, bounds
        self.lo = bounds.least_workers(fam, most_workers)
        self.best: Candidate | None = None          # the cheapest passing size so far
        if fam.disaggregated:
            self.d_min = bounds.least_decode(fam, most_workers)
            self.p, self.d_lo = self.lo, self.d_min
            self.d_hi = most_workers - self.p
        else:
            self.hi = most_workers

    def probe(self, within: Callable[[int], bool]) -> Candidate | None:
        """The next size, of workers for which `within(workers)` is True."""
        f = self.fam
        if not f.disaggregated:
            while self.hi >= self.lo and not within(self.hi):
                self.hi -= 1
            if self.lo > self.hi:
                return None
            return Candidate(f, replicas=(self.lo + self.hi) // 2)
        while True:
            # more prefill workers never make the cheapest size left cheaper
            cheapest = self.p + self.d_min
            bound = self.best.workers if self.best is not None else self.most + 1
            if cheapest > self.most or cheapest >= bound or not within(cheapest):
                return None
            while self.d_hi >= self.d_lo and not within(self.p + self.d_hi):
                self.d_hi -= 1
            if self.d_lo <= self.d_hi:
                return Candidate(f, prefill=self.p, decode=(self.d_lo + self.d_hi) // 2)
            self._next_p()

    def _next_p(self) -> None:
        # the fewest passing decode workers never grow with the prefill workers
        self.p += 1
        self.d_lo = self.d_min
        self.d_hi = min(self.most - self.p, self.best.decode if self.best else self.most)

    def seen(self, row: Row) -> None:
        c = row.candidate
        if not self.fam.disaggregated:
            if row.meets:
                self.best, self.hi = c, c.replicas - 1
            else:
                self.lo = c.replicas + 1
            return
        if row.meets:
            if self.best is None or c.workers < self.best.workers:
                self.best = c
            self.d_hi = min(self.d_hi, c.decode - 1)
        else:
            self.d_lo = c.decode + 1


@dataclass
class Search:
    rows: list[Row]
    pruned: int                    # sizes the rules skipped (curves, cost)
    rounds: int


def search(setting: Setting, families: Sequence[Family], slo: SLO, max_gpus: int,
           bounds: Bounds, run: Callable[[Sequence[Job]], list[Outcome]],
           prices: Mapping[str, float] | None = None, keep: int = 3,
           progress: Callable[[int, int], object] | None = None) -> Search:
    """Simulate what the rules keep; `run` simulates a batch of jobs; `progress(round, rows)`
    after each round."""
    prices = prices or {}
    rows: dict[Candidate, Row] = {}
    known: dict[Candidate, Outcome] = {}
    sizings = [Sizing(f, max_gpus // f.tp, bounds) for f in families]
    whole = sum(len(_sizes(f, max_gpus // f.tp)) for f in families)
    rounds = 0
    while True:
        passing = recommend(rows.values(), keep)
        bar = passing[keep - 1].cost if len(passing) >= keep else float("inf")
        batch: list[tuple[Sizing, Candidate]] = []
        for s in sizings:
            price = prices.get(s.fam.gpu, 1.0)

            def within(workers: int, s=s, price=price) -> bool:
                return workers * s.fam.tp * price * bounds.span / 3600 < bar

            c = s.probe(within)
            if c is not None:
                batch.append((s, c))
        if not batch:
            break
        rounds += 1
        outs = _run_once(run, [c for _, c in batch], known)
        for (s, c), o in zip(batch, outs):
            hours = c.gpus * o.makespan_s / 3600
            rows[c] = Row(c, o, slo.meets(o), hours, hours * prices.get(c.family.gpu, 1.0))
            s.seen(rows[c])
        if progress is not None:
            progress(rounds, len(rows))
    return Search(sorted(rows.values(), key=Row.key), whole - len(rows), rounds)


def recommend(rows, keep: int) -> list[Row]:
    """The `keep` cheapest passing rows, one per family (its smallest passing size) and one
    per distinct simulation."""
    fams: dict[Family, Row] = {}
    for r in sorted(rows, key=Row.key):
        if r.meets:
            fams.setdefault(r.candidate.family, r)
    runs: dict[Candidate, Row] = {}
    for r in fams.values():
        runs.setdefault(same_run(r.candidate), r)
    return list(runs.values())[:keep]


def same_run(c: Candidate) -> Candidate:
    """The candidate whose simulation is `c`'s: a router in front of one worker has no choice
    to make, so that candidate's router is round-robin."""
    one = c.prefill == 1 if c.family.disaggregated else c.replicas == 1
    if not one or c.family.router == "round-robin":
        return c
    return replace(c, family=replace(c.family, router="round-robin"))


def _run_once(run: Callable[[Sequence[Job]], list[Outcome]], cands: Sequence[Candidate],
              known: dict[Candidate, Outcome]) -> list[Outcome]:
    """Outcomes of `cands`, each distinct simulation run once (`known` keeps them)."""
    todo = list(dict.fromkeys(same_run(c) for c in cands if same_run(c) not in known))
    known.update(zip(todo, run([Job(c) for c in todo])))
    return [known[same_run(c)] for c in cands]


def _sizes(fam: Family, most: int) -> list[tuple[int, int]]:
    """Every size of a family within `most` workers (what an exhaustive search simulates)."""
    if fam.disaggregated:
        return [(p, d) for p in range(1, most) for d in range(1, most - p + 1)]
    return [(n, 0) for n in range(1, most + 1)]


def exhaustive(setting: Setting, families: Sequence[Family], slo: SLO, max_gpus: int,
               run: Callable[[Sequence[Job]], list[Outcome]],
               prices: Mapping[str, float] | None = None) -> list[Row]:
    """Every size of every family simulated: what `search` must agree with."""
    prices = prices or {}
    cands = []
    for f in families:
        for a, b in _sizes(f, max_gpus // f.tp):
            cands.append(Candidate(f, prefill=a, decode=b) if f.disaggregated
                         else Candidate(f, replicas=a))
    out = []
    for c, o in zip(cands, _run_once(run, cands, {})):
        hours = c.gpus * o.makespan_s / 3600
        out.append(Row(c, o, slo.meets(o), hours, hours * prices.get(c.family.gpu, 1.0)))
    return sorted(out, key=Row.key)
