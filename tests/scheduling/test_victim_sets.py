"""The victim-set search (airflow_ett/scheduling/victim_sets.py): which sets a tenant's
guarantee allows, checked against every pick order; the most each tenant can yield; the
search's preference (first in order, or least cost) and its bound; minimising."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.scheduling.victim_sets import (
    Candidate,
    allowed,
    minimise,
    most_freeable,
    pick_order,
    search,
)


def c(job: str, gpus: int, tenant: str = "lo", cost: float = 0.0,
      yield_in_s: float = 0.0) -> Candidate:
    return Candidate(job, tenant, gpus, cost, yield_in_s)


def some_order_works(victims: Sequence[Candidate], over: dict[str, int]) -> bool:
    """Rule 3 read literally: some order takes each victim while its tenant is still over
    its guarantee (its GPUs before the pick minus the quota > 0)."""
    for order in itertools.permutations(victims):
        left = dict(over)
        ok = True
        for v in order:
            if left.get(v.tenant, 0) <= 0:
                ok = False
                break
            left[v.tenant] -= v.gpus
        if ok:
            return True
    return False


def test_the_issues_example_greedy_falls_short_the_search_does_not() -> None:
    """Tenant lo, quota 8, holds 12 in a job of 8 and one of 4 (4 over); a job needs 8.
    Greedy takes the preferred 4-GPU job, then lo is at its quota: nothing more. The 8-GPU
    job alone is allowed."""
    small, big = c("small", 4), c("big", 8)
    assert not allowed([small, big], {"lo": 4})  # 4 + 8 - 8 = 4, not below 4
    assert allowed([big], {"lo": 4}) and allowed([small], {"lo": 4})
    for rate in (None, 0.0, 1.0):
        assert search([small, big], {"lo": 4}, 8, wait_rate=rate) == [big]
    assert most_freeable([small, big], {"lo": 4}) == {"lo": [big]}


def test_a_tenant_yields_the_largest_last() -> None:
    """3 over: an 8 and a 2 may go (take the 2 first, then 8 is still 1 over), not an 8
    and a 4; the order given puts the largest last."""
    eight, two, four = c("eight", 8), c("two", 2), c("four", 4)
    assert allowed([eight, two], {"lo": 3}) and not allowed([eight, four], {"lo": 3})
    assert pick_order([eight, two]) == [two, eight]
    assert pick_order([c("x", 1, "a"), eight, c("y", 1, "b"), two]) == [
        c("x", 1, "a"), two, c("y", 1, "b"), eight]
    assert most_freeable([four, eight, two], {"lo": 3}) == {"lo": [eight, two]}
    assert most_freeable([four, eight], {"lo": 0}) == {"lo": []}


def test_classic_takes_the_first_set_in_its_order_least_cost_the_cheapest() -> None:
    a, b, big = c("a", 4, cost=10.0), c("b", 4, cost=12.0), c("big", 8, cost=15.0)
    over = {"lo": 100}
    assert search([a, b, big], over, 8, wait_rate=None) == [a, b]  # greedy: first found
    assert search([a, b, big], over, 8, wait_rate=0.0) == [big]  # 15 < 10 + 12
    # the wait is priced at its longest: a and b leave in 60 s, big in 600 s
    a, b = c("a", 4, cost=10.0, yield_in_s=60.0), c("b", 4, cost=12.0, yield_in_s=60.0)
    big = c("big", 8, cost=15.0, yield_in_s=600.0)
    assert search([a, b, big], over, 8, wait_rate=0.1) == [a, b]  # 22 + 6 < 15 + 60
    assert search([a, b, big], over, 8, wait_rate=0.001) == [big]  # 15.6 < 22.06


def test_nothing_found_is_none_and_a_bounded_search_may_find_nothing() -> None:
    assert search([c("a", 4), c("b", 4)], {"lo": 4}, 8, wait_rate=None) is None
    assert search([c("a", 8)], {"lo": 4}, 8, wait_rate=1.0, steps=0) is None
    assert search([c("a", 8)], {"lo": 4}, 8, wait_rate=1.0, steps=1) == [c("a", 8)]


def test_minimise_walks_back_from_the_last() -> None:
    picks = [c("v1", 1), c("v2", 1), c("v3", 4)]
    assert minimise(picks, 4) == [c("v3", 4)]
    assert minimise(picks, 5) == [c("v1", 1), c("v3", 4)]
    assert minimise(picks, 6) == picks


candidates_st = st.lists(
    st.builds(Candidate, job=st.just(""), tenant=st.sampled_from(["a", "b", "c"]),
              gpus=st.sampled_from([1, 2, 3, 4, 8]),
              cost=st.sampled_from([0.0, 10.0, 40.0, 300.0]),
              yield_in_s=st.sampled_from([0.0, 30.0, 600.0])),
    max_size=7).map(lambda cs: [Candidate(f"j{i}", x.tenant, x.gpus, x.cost, x.yield_in_s)
                                for i, x in enumerate(cs)])
overs_st = st.fixed_dictionaries({t: st.integers(-2, 12) for t in "abc"})


def subsets(cands: Sequence[Candidate]) -> list[tuple[Candidate, ...]]:
    return [s for n in range(len(cands) + 1) for s in itertools.combinations(cands, n)]


@settings(max_examples=300, deadline=None)
@given(cands=candidates_st, over=overs_st, lacking=st.integers(1, 20),
       rate=st.sampled_from([None, 0.0, 0.05, 1.0]))
def test_the_search_finds_a_set_exactly_when_one_exists(
        cands: list[Candidate], over: dict[str, int], lacking: int, rate: float | None) -> None:
    feasible = [s for s in subsets(cands) if some_order_works(s, over)
                and sum(x.gpus for x in s) >= lacking]
    found = search(cands, over, lacking, wait_rate=rate)
    most = most_freeable(cands, over)
    assert (sum(x.gpus for g in most.values() for x in g) >= lacking) == bool(feasible)
    for tenant, group in most.items():
        assert some_order_works(group, over)
        best = max((sum(x.gpus for x in s) for s in subsets([x for x in cands
                                                             if x.tenant == tenant])
                    if some_order_works(s, over)), default=0)
        assert sum(x.gpus for x in group) == best
    if not feasible:
        assert found is None
        return
    assert found is not None and sum(x.gpus for x in found) >= lacking
    assert allowed(found, over) and some_order_works(found, over)
    kept = minimise(found, lacking)
    assert sum(x.gpus for x in kept) >= lacking
    assert all(sum(x.gpus for x in kept) - x.gpus < lacking for x in kept)
    order = pick_order(kept)
    left = dict(over)
    for x in order:  # the order given takes each one while its tenant is still over
        assert left[x.tenant] > 0
        left[x.tenant] -= x.gpus
    if rate is not None:  # the least cost of all feasible sets
        def cost(s: Sequence[Candidate]) -> float:
            return sum(x.cost for x in s) + rate * max((x.yield_in_s for x in s), default=0.0)
        assert cost(found) == pytest.approx(min(cost(s) for s in feasible))
    else:  # the first feasible set in preference order (include before exclude)
        def rank(s: Sequence[Candidate]) -> list[bool]:
            chosen = {x.job for x in s}
            return [x.job not in chosen for x in cands]
        # a depth-first path ends where it first frees enough: its last pick was needed
        paths = [s for s in feasible if sum(x.gpus for x in s) - s[-1].gpus < lacking]
        assert rank(found) == min(rank(s) for s in paths)
