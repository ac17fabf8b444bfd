"""Events from every rank fold into one job timeline: rank 0 leads (progress, the
attempt's status and cause, its phases first); other ranks' phases are kept and count
only where rank 0 shows nothing; an attempt ends when its last rank does
(docs/decisions/0017-multi-rank.md)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    Event,
    JobEnded,
    JobSubmitted,
    PhaseEnded,
    PhaseStarted,
    Progress,
    event_to_json,
    parse_line,
    with_rank,
)
from airflow_ett.ett.synthetic import JobSpec, simulate
from airflow_ett.ett.timeline import to_us
from tests.ett.strategies import REPORTABLE, specs
from tests.ett.test_properties import check_levels_agree, check_partition, check_rows_agree

T = 1_800_000_000.0


def test_a_ranked_event_is_version_2_and_round_trips() -> None:
    e = with_rank(PhaseStarted(id="p", job="j", ts=T, phase="compile", attempt="1"), 3)
    text = event_to_json(e)
    assert '"v":2' in text and '"rank":3' in text
    assert parse_line(text) == e
    plain = PhaseStarted(id="q", job="j", ts=T, phase="compile", attempt="1")
    assert with_rank(plain, 0) is plain and '"rank"' not in event_to_json(plain)


def job(*extra: Event) -> list[Event]:
    """Rank 0: submitted at T, attempt 1 from T+1: model_creation [T+1, T+3), waiting
    (nothing reported) until its first step at T+10, 10 s of steps, ends at T+21."""
    return [
        JobSubmitted(id="s", job="j", ts=T),
        AttemptStarted(id="a", job="j", ts=T + 1, attempt="1"),
        PhaseStarted(id="m0", job="j", ts=T + 1, phase="model_creation", attempt="1"),
        PhaseEnded(id="m1", job="j", ts=T + 3, phase="model_creation", attempt="1"),
        Progress(id="p", job="j", ts=T + 20, start_ts=T + 10, attempt="1", step_start=0,
                 step_end=100, cursor_start=0, cursor_end=1000),
        AttemptEnded(id="e", job="j", ts=T + 21, attempt="1", status="success"),
        *extra,
    ]


def ranked(rank: int, event: Event) -> Event:
    return with_rank(event, rank)


def test_another_rank_s_phase_fills_only_where_rank_0_shows_nothing() -> None:
    # rank 1 builds its data pipeline [T+2, T+8): rank 0 is in model_creation until T+3,
    # then waits (startup_other) until T+10
    base = attribute_job(job())
    r = attribute_job(job(
        ranked(1, PhaseStarted(id="r0", job="j", ts=T + 2, phase="data_pipeline_init",
                               attempt="1")),
        ranked(1, PhaseEnded(id="r1", job="j", ts=T + 8, phase="data_pipeline_init",
                             attempt="1"))))
    assert r.phases_us["model_creation"] == base.phases_us["model_creation"] == to_us(2)
    assert r.phases_us["data_pipeline_init"] == to_us(5)  # [T+3, T+8): rank 0 idle
    assert r.phases_us["startup_other"] == base.phases_us["startup_other"] - to_us(5)
    assert r.effective_us == base.effective_us
    assert "data_pipeline_init" not in r.phases_raw_us  # raw durations stay rank 0's
    assert r.rank_phases == ((1, to_us(T + 2), to_us(T + 8), "data_pipeline_init"),)
    rows = r.to_dict(include_timeline=True)["rank_phases"]
    assert rows == [[1, 2.0, 8.0, "initialization", "data_pipeline_init"]]
    check_partition(r)


def test_the_attempt_ends_with_its_last_rank_and_rank_0_s_word_is_its_cause() -> None:
    events = job(ranked(1, AttemptEnded(id="x", job="j", ts=T + 25, attempt="1",
                                        status="failed", cause="infra")))
    events = [e for e in events if e.id != "e"] + [
        AttemptEnded(id="e", job="j", ts=T + 21, attempt="1", status="failed",
                     cause="application"),
        JobEnded(id="z", job="j", ts=T + 30, status="failed")]
    r = attribute_job(events)
    (row,) = r.attempts
    assert row.end == pytest.approx(T + 25)  # rank 1 ended last
    assert (row.status, row.cause) == ("failed", "application")  # rank 0's word
    assert r.nof["application"] == 1 and r.nof["total"] == 1


def test_other_ranks_never_open_an_attempt_or_report_progress() -> None:
    base = attribute_job(job())
    r = attribute_job(job(
        ranked(2, AttemptStarted(id="o", job="j", ts=T - 5, attempt="9")),
        ranked(2, Progress(id="q", job="j", ts=T + 20, start_ts=T + 10, attempt="1",
                           step_start=0, step_end=100, cursor_start=1000,
                           cursor_end=5000)),
        ranked(2, PhaseStarted(id="w", job="j", ts=T + 5, phase="compile", attempt="9"))))
    assert [a.attempt for a in r.attempts] == ["1"]
    assert r.effective_us == base.effective_us and r.e2e_us == base.e2e_us
    assert any("attempt(s) ['9'] that rank 0 never reported" in w for w in r.warnings)


# -- properties ------------------------------------------------------------------------

@st.composite
def rank_events(draw: st.DrawFn, spec: JobSpec) -> list[Event]:
    """Anything ranks 1-3 could send about the job `spec` simulates (its attempts "1",
    "2"...), at any time of its life, with ties."""
    t0 = spec.submit_ts
    times = st.integers(0, 120).map(lambda s: t0 + s)
    attempts = st.sampled_from(["1", "2", "3"])
    out: list[Event] = []
    for i in range(draw(st.integers(1, 20))):
        kind = draw(st.integers(0, 5))
        t = draw(times)
        common: dict[str, Any] = {"id": f"r{i}", "job": spec.job, "ts": t}
        a = draw(attempts)
        if kind in (0, 1):
            cls = PhaseStarted if kind == 0 else PhaseEnded
            event: Event = cls(**common, phase=draw(st.sampled_from(REPORTABLE)),
                               attempt=draw(st.none() | attempts),
                               span=draw(st.sampled_from(["", "s"])))
        elif kind == 2:
            status = draw(st.sampled_from(["success", "failed"]))
            event = AttemptEnded(**common, attempt=a, status=status,
                                 cause="infra" if status == "failed" else None)
        elif kind == 3:
            event = AttemptStarted(**common, attempt=a)
        elif kind == 4:
            c0 = draw(st.integers(0, 10**6))
            event = Progress(**common, attempt=a, start_ts=t - 1, step_start=0, step_end=5,
                             cursor_start=c0, cursor_end=c0 + 10**6)
        else:
            event = CheckpointSaved(**common, attempt=a, start_ts=t - 1, step=1, cursor=1,
                                    blocking_s=1.0, total_s=1.0)
        out.append(with_rank(event, draw(st.integers(1, 3))))
    return out


@st.composite
def ranked_jobs(draw: st.DrawFn) -> tuple[list[Event], list[Event]]:
    spec = draw(specs)
    return simulate(spec), draw(rank_events(spec))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranked_jobs(), st.randoms())
def test_other_ranks_never_change_progress_totals_or_causes(
        job_and_ranks: tuple[list[Event], list[Event]], rnd: Any) -> None:
    events, extra = job_and_ranks
    before = attribute_job(events)
    mixed = [*events, *extra]
    after = attribute_job(mixed)
    assert after.effective_us == before.effective_us
    assert after.phases_us.get("replay", 0) == before.phases_us.get("replay", 0)
    assert after.nof == before.nof
    assert [(a.attempt, a.status, a.cause, a.start) for a in after.attempts] == [
        (a.attempt, a.status, a.cause, a.start) for a in before.attempts]
    # rank 0's own phases keep every microsecond they had
    for label, us in before.phases_us.items():
        if label in before.phases_raw_us:
            assert after.phases_us.get(label, 0) >= us, label
    check_partition(after)
    check_levels_agree(after)
    check_rows_agree(after)
    rnd.shuffle(mixed)
    assert attribute_job(mixed).to_dict(include_timeline=True) == after.to_dict(
        include_timeline=True)
