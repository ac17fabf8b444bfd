"""A tenant's grace against its jobs' measured checkpoint saves (`tenants check`), with
hand-made numbers: which p90, which tenants are warned, and what each line says."""

from __future__ import annotations

import pytest

from airflow_ett.scheduling.model import TenantPolicy
from airflow_ett.scheduling.save_times import (
    GraceCheck,
    SavePrior,
    SaveTime,
    check_grace,
    grace_line,
    save_prior,
    seconds,
)


def policy(name: str, grace_s: float, *, preemptible: bool = True) -> TenantPolicy:
    return TenantPolicy(name=name, priority=1, quota_gpus=1, grace_s=grace_s,
                        preemptible=preemptible)


TENANTS = {p.name: p for p in (policy("ads", 30), policy("batch", 120), policy("eval", 60),
                               policy("infer", 10, preemptible=False))}


def test_the_p90_of_each_tenants_saves_against_its_grace_in_file_order() -> None:
    saves = {
        # p90 of 10, 20, ..., 100: rank 8.1 of 0..9, 90 + 0.1 * 10 = 91 > 30
        "ads": [100.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0],
        # p90 of 50, 60: 59 <= 120
        "batch": [60.0, 50.0],
        "infer": [500.0],  # far over its grace, but it is never preempted
        "gone": [1e6],  # a tenant the file no longer names: not checked
    }
    checks = check_grace(TENANTS, saves)
    assert checks == [
        GraceCheck("ads", 30.0, True, 10, pytest.approx(91.0)),
        GraceCheck("batch", 120.0, True, 2, pytest.approx(59.0)),
        GraceCheck("eval", 60.0, True, 0, None),
        GraceCheck("infer", 10.0, False, 1, 500.0),
    ]
    assert [c.tenant for c in checks if c.too_short] == ["ads"]


def test_a_save_exactly_as_long_as_the_grace_fits_and_one_a_tenth_longer_does_not() -> None:
    assert not GraceCheck("a", 30.0, True, 1, 30.0).too_short
    assert GraceCheck("a", 30.0, True, 1, 30.1).too_short
    assert not GraceCheck("a", 30.0, True, 0, None).too_short


def test_the_warning_says_what_is_lost_and_the_two_ways_out() -> None:
    check = GraceCheck("ads", 30.0, True, 42, 120.04)
    assert grace_line(check, days=7, wait_price=0.25) == (
        "warning: tenant ads: grace_s 30 s is shorter than its jobs' p90 checkpoint save of "
        "120 s (42 saves, last 7 days): a job preempted at once is killed before its "
        "checkpoint commits and loses its work since the last one; raise grace_s, or lower "
        "[scheduling] checkpoint_wait_price (now 0.25), so that victims wait for their next "
        "checkpoint more often")
    # At the highest price every victim yields at once: the line says so.
    assert grace_line(check, days=1, wait_price=1e6).endswith(
        "(42 saves, last 1 day): a job preempted at once is killed before its checkpoint "
        "commits and loses its work since the last one; raise grace_s, or lower [scheduling] "
        "checkpoint_wait_price (now 1e+06: every victim yields at once), so that victims wait "
        "for their next checkpoint more often")


def test_the_other_lines_are_no_warnings() -> None:
    lines = [grace_line(c, days=7, wait_price=0.25) for c in (
        GraceCheck("batch", 120.0, True, 1, 59.26),
        GraceCheck("eval", 60.0, True, 0, None),
        GraceCheck("infer", 10.0, False, 3, 500.0),
    )]
    assert lines == [
        "tenant batch: grace_s 120 s covers its jobs' p90 checkpoint save of 59.3 s "
        "(1 save, last 7 days)",
        "tenant eval: no non-final checkpoint save of its jobs in the ETT store (last 7 "
        "days): grace_s 60 s not checked",
        "tenant infer: its jobs' p90 checkpoint save of 500 s (3 saves, last 7 days); not "
        "preemptible, so its grace_s 10 s never applies",
    ]
    assert not any(line.startswith("warning") for line in lines)


@pytest.mark.parametrize(("value", "shown"), [(30.0, "30"), (117.3456, "117.3"),
                                              (0.04, "0"), (1234567.0, "1234567")])
def test_seconds_are_shown_to_a_tenth(value: float, shown: str) -> None:
    assert seconds(value) == shown


# -- the prior: a tenant's recent saves for a job that has not saved yet -----------------

def test_the_prior_is_the_median_save_the_p90_exit_save_and_the_median_commit_wait() -> None:
    saves = [SaveTime(total_s=t, commit_wait_s=w) for t, w in
             [(100.0, 80.0), (10.0, 5.0), (20.0, 15.0), (30.0, 25.0), (40.0, 35.0),
              (50.0, 45.0), (60.0, 55.0), (70.0, 65.0), (80.0, 75.0), (90.0, 85.0)]]
    # the median of 10..100 is 55; the p90, as `tenants check` says it, 91; the median
    # commit wait of 5..85 (and 80) is 50
    assert save_prior(saves) == SavePrior(typical_s=55.0, exit_s=pytest.approx(91.0),
                                          commit_wait_s=50.0, saves=10)
    assert save_prior([]) is None


def test_a_save_time_out_of_bounds_counts_as_nothing_never_as_more_than_the_save() -> None:
    """A clock step can make a figure negative or absurd: the prior errs short."""
    odd = [SaveTime(-5.0, -1.0), SaveTime(float("nan"), 3.0), SaveTime(float("inf"), 2.0),
           SaveTime(10.0, 50.0)]  # a commit wait longer than its save: the save bounds it
    prior = save_prior(odd)
    assert prior is not None
    assert (prior.typical_s, prior.exit_s, prior.commit_wait_s) == (0.0, pytest.approx(7.0),
                                                                    0.0)
