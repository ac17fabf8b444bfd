"""Which set of eligible victims frees a waiting job's GPUs: the search behind
`victims.choose`, pure arithmetic on GPU counts and costs.

The tenant rule (rule 3 of `victims`): a victim is taken only while its tenant is over its
guarantee *before the pick*. For a set of victims of one tenant that is over by `over` GPUs
(held - quota), some pick order works exactly when the victims other than the largest add
up to less than `over` (take the largest last: each earlier pick leaves the tenant still
over; any other order leaves less room before the last pick). So a set is **allowed** when,
for each of its tenants, `sum - largest < over`. Whether a set is allowed does not depend
on the order, and every subset of an allowed set is allowed (dropping a victim never
raises `sum - largest`), so minimising a set keeps it allowed.

Three questions, three functions:

- `most_freeable`: the most GPUs each tenant can yield (exact: its largest job, plus the
  largest sum of its other jobs below `over`, a subset-sum over at most `over - 1` GPUs).
  Tenants are independent, so a feasible set exists exactly when these add up to what is
  lacking; this also says, for a waiting job's reason, which tenant's guarantee blocked.
- `search`: the preferred allowed set that frees enough. Candidates come most preferred
  first; a depth-first search includes before it excludes, so its first complete set is
  the greedy pick (each candidate in order, when allowed, until enough) and, when greedy
  falls short, it backtracks to the next set in preference order. With a wait rate it is
  a branch-and-bound for the least cost (`sum of losses + rate x the latest yield`: the
  stage-aware order's expected loss plus the price of the waiting job's wait); without
  one it returns the first set found (the classic order's own preference, in its order).
- `minimise`: Kueue's walk back: from the last candidate to the first, drop a victim whose
  removal still frees enough.

Why the search is bounded. Finding the cheapest set is a covering knapsack (NP-hard in
general); a fleet has tens of running jobs and a decision a handful of eligible ones,
where the pruning (no set that cannot free enough with what is left, none that cannot
cost less than the best found) ends the search within hundreds of steps. A fleet of
hundreds of small eligible jobs could make it exponential, so it stops after
`SEARCH_STEPS` steps (milliseconds: a controller tick, or a simulated fleet's thousands of
decisions, must not stall) and keeps the best set found so far; if it found none by then,
the `most_freeable` sets are taken (then minimised): a feasible set is never missed, only
its preference is approximate past the bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

#: Steps (a candidate tried) before the search keeps the best set it found (see above).
SEARCH_STEPS: Final = 20_000


@dataclass(frozen=True, slots=True)
class Candidate:
    """An eligible victim as the search sees it: its tenant and GPUs, the GPU-seconds it is
    expected to lose (`cost`) and when its GPUs would be free (`yield_in_s`)."""

    job: str
    tenant: str
    gpus: int
    cost: float = 0.0
    yield_in_s: float = 0.0


def allowed(victims: Sequence[Candidate], over: Mapping[str, int]) -> bool:
    """Whether each tenant, `over[tenant]` GPUs over its guarantee, can yield these
    victims, each while it is still over (see the module docstring)."""
    by_tenant: dict[str, list[int]] = {}
    for victim in victims:
        by_tenant.setdefault(victim.tenant, []).append(victim.gpus)
    return all(sum(g) - max(g) < over.get(t, 0) for t, g in by_tenant.items())


def pick_order(victims: Sequence[Candidate]) -> list[Candidate]:
    """The victims in an order that takes each one while its tenant is still over its
    guarantee: as given, except that each tenant's largest job (the last of its largest)
    moves to that tenant's last place."""
    order = list(victims)
    for tenant in dict.fromkeys(v.tenant for v in victims):
        places = [i for i, v in enumerate(order) if v.tenant == tenant]
        own = [order[i] for i in places]
        largest = max(range(len(own)), key=lambda i: (own[i].gpus, i))
        own.append(own.pop(largest))
        for place, victim in zip(places, own, strict=True):
            order[place] = victim
    return order


def most_freeable(candidates: Sequence[Candidate], over: Mapping[str, int]
                  ) -> dict[str, list[Candidate]]:
    """Per tenant, an allowed set of its candidates freeing the most GPUs (a tenant not
    over its guarantee yields nothing). Among equal sums, the more preferred candidates
    (earlier in `candidates`) are kept."""
    by_tenant: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_tenant.setdefault(candidate.tenant, []).append(candidate)
    return {tenant: _tenant_most(own, over.get(tenant, 0)) for tenant, own in
            by_tenant.items()}


def _tenant_most(own: Sequence[Candidate], over: int) -> list[Candidate]:
    """The largest job (some optimal set has it as its largest: swapping it in for any
    other largest frees more), plus the others' largest sum below `over`."""
    if over <= 0 or not own:
        return []
    largest = max(range(len(own)), key=lambda i: (own[i].gpus, -i))
    rest = [c for i, c in enumerate(own) if i != largest]
    reach: dict[int, tuple[int, ...]] = {0: ()}
    for i, candidate in enumerate(rest):
        for total, picked in list(reach.items()):
            more = total + candidate.gpus
            if more < over and more not in reach:
                reach[more] = (*picked, i)
    best = reach[max(reach)]
    chosen = {own[largest].job, *(rest[i].job for i in best)}
    return [c for c in own if c.job in chosen]


def minimise(picked: Sequence[Candidate], lacking: int) -> list[Candidate]:
    """Kueue's walk back: from the last pick to the first, drop a victim whose removal
    still frees `lacking` GPUs. What stays keeps its order."""
    kept = list(picked)
    freed = sum(c.gpus for c in kept)
    for candidate in reversed(picked):
        if freed - candidate.gpus >= lacking:
            kept.remove(candidate)
            freed -= candidate.gpus
    return kept


def search(candidates: Sequence[Candidate], over: Mapping[str, int], lacking: int, *,
           wait_rate: float | None, steps: int | None = None) -> list[Candidate] | None:
    """The preferred allowed set of `candidates` (most preferred first) freeing at least
    `lacking` GPUs, or None if the search found none within `steps` (None:
    `SEARCH_STEPS`; see the module docstring). `wait_rate`: GPU-seconds per second of the
    latest victim's yield, for the least-cost search; None: the first set in preference
    order."""
    return _Search(candidates, over, lacking, wait_rate).run(
        SEARCH_STEPS if steps is None else steps)


class _Search:
    """The depth-first branch-and-bound of `search`, iterative (a fleet of hundreds of
    small jobs must not hit the recursion limit). A path is the candidates included so
    far, in index order; per tenant it keeps the sum and the largest for `allowed`."""

    def __init__(self, candidates: Sequence[Candidate], over: Mapping[str, int], lacking: int,
                 wait_rate: float | None) -> None:
        self.cands = list(candidates)
        self.over = over
        self.lacking = lacking
        self.rate = wait_rate
        n = len(self.cands)
        # what the candidates from i on can free at most, and their least cost per GPU
        self.gpus_from = [0] * (n + 1)
        self.density_from = [math.inf] * (n + 1)
        for i in range(n - 1, -1, -1):
            c = self.cands[i]
            self.gpus_from[i] = self.gpus_from[i + 1] + c.gpus
            self.density_from[i] = min(self.density_from[i + 1], c.cost / c.gpus)
        self.path: list[int] = []
        self.sums: dict[str, int] = {}
        self.largest: dict[str, list[int]] = {}
        self.freed = 0
        # along the path: the costs' running sum and the latest yield (stacks: exact undo)
        self.costs: list[float] = [0.0]
        self.latest: list[float] = [0.0]
        self.best: list[int] | None = None
        self.best_cost = math.inf

    def run(self, steps: int) -> list[Candidate] | None:
        i, taken = 0, 0
        while True:
            if i < len(self.cands) and taken < steps and self._promising(i):
                taken += 1
                if self._fits(self.cands[i]):
                    self._push(i)
                    if self.freed >= self.lacking:
                        if self._record() and self.rate is None:
                            break
                        self._pop()
                i += 1
                continue
            if not self.path:
                break
            i = self._pop() + 1
        return None if self.best is None else [self.cands[j] for j in self.best]

    def _promising(self, i: int) -> bool:
        """Whether candidates from `i` on may still complete the path (enough GPUs left)
        into a set cheaper than the best found."""
        need = self.lacking - self.freed
        if self.gpus_from[i] < need:
            return False
        if self.rate is None:
            return True
        bound = self.costs[-1] + need * self.density_from[i] + self.rate * self.latest[-1]
        return bound < self.best_cost

    def _fits(self, c: Candidate) -> bool:
        total = self.sums.get(c.tenant, 0) + c.gpus
        top = max(self.largest.get(c.tenant, [0])[-1], c.gpus)
        return total - top < self.over.get(c.tenant, 0)

    def _push(self, i: int) -> None:
        c = self.cands[i]
        self.path.append(i)
        self.sums[c.tenant] = self.sums.get(c.tenant, 0) + c.gpus
        stack = self.largest.setdefault(c.tenant, [0])
        stack.append(max(stack[-1], c.gpus))
        self.freed += c.gpus
        self.costs.append(self.costs[-1] + c.cost)
        self.latest.append(max(self.latest[-1], c.yield_in_s))

    def _pop(self) -> int:
        i = self.path.pop()
        c = self.cands[i]
        self.sums[c.tenant] -= c.gpus
        self.largest[c.tenant].pop()
        self.freed -= c.gpus
        self.costs.pop()
        self.latest.pop()
        return i

    def _record(self) -> bool:
        """Keep the path if it is the best so far; True if it was."""
        total = self.costs[-1] + (self.rate or 0.0) * self.latest[-1]
        if self.best is not None and not total < self.best_cost:
            return False
        self.best, self.best_cost = list(self.path), total
        return True
