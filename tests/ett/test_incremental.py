"""The incremental attribution (`ett/attribution/incremental.py`, decision 0034) gives
exactly what one pass gives: `attribute_job` of every event added so far, in the store's
order, whatever arrived late, in whatever batches, at whatever `now`.

Streams: simulated jobs (failures, restores and replay, checkpoints, a job that ends),
their progress stretched or squeezed (per-step times that move the slow-step ideal,
spans that overlap or leave gaps), other ranks' phases, ends and progress, rank step
reports, and arbitrary soups. Arrival: mostly in time order, some events late (a store
orders by time, then by ingest: a late event lands before events already read).
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.attribution.incremental import IncrementalAttribution
from airflow_ett.ett.attribution.live_ranks import Key
from airflow_ett.ett.events import Event, Progress, RankSteps, with_rank
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from tests.ett.strategies import soups, specs
from tests.ett.test_multirank import rank_events

STRETCH = st.sampled_from([0.5, 0.9, 1.0, 1.0, 1.0, 1.1, 1.7, 3.0])


@st.composite
def stretched(draw: st.DrawFn, events: list[Event]) -> list[Event]:
    """Progress spans lasting other than their steps said: the ideal moves, spans
    overlap or leave gaps."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, Progress) and draw(st.booleans()):
            e = msgspec.structs.replace(e, ts=e.start_ts + (e.ts - e.start_ts) * draw(STRETCH))
        out.append(e)
    return out


@st.composite
def rank_reports(draw: st.DrawFn, spec: JobSpec) -> list[Event]:
    out: list[Event] = []
    for i in range(draw(st.integers(0, 12))):
        t = spec.submit_ts + draw(st.integers(0, 120))
        first = draw(st.integers(0, 5)) * 20
        out.append(with_rank(RankSteps(
            id=f"s{i}", job=spec.job, ts=t, attempt=draw(st.sampled_from(["1", "2"])),
            start_ts=t - 1, step_start=first, step_end=first + draw(st.integers(1, 20)),
            busy_s=draw(st.sampled_from([0.5, 1.0, 1.3, 4.0])),
            wait_s=draw(st.sampled_from([0.0, 0.25, 1.0]))), draw(st.integers(0, 3))))
    return out


@st.composite
def jobs(draw: st.DrawFn) -> list[Event]:
    spec = draw(specs)
    events = draw(stretched(simulate(spec)))
    if draw(st.booleans()):
        events += draw(rank_events(spec))
    if draw(st.booleans()):
        events += draw(rank_reports(spec))
    return events


@st.composite
def arrivals(draw: st.DrawFn, events: list[Event]) -> list[Event]:
    """Time order, but some events late: each late one (a span, as often as not) moved
    further on."""
    order = sorted(events, key=lambda e: e.ts)
    for _ in range(draw(st.integers(0, 6))):
        if len(order) < 2:
            break
        spans = [i for i, e in enumerate(order[:-1]) if isinstance(e, Progress)]
        if spans and draw(st.booleans()):
            i = draw(st.sampled_from(spans))
        else:
            i = draw(st.integers(0, len(order) - 2))
        j = draw(st.integers(i + 1, len(order) - 1))
        order.insert(j, order.pop(i))
    return order


def check_fed_in_batches(events: list[Event], data: st.DataObject) -> IncrementalAttribution:
    """Feed `events` (in arrival order) in batches; after each, compare with one pass."""
    inc = IncrementalAttribution()
    stored: list[tuple[Key, Event]] = []
    at = 0
    while at < len(events):
        n = data.draw(st.integers(1, 12), label="batch")
        for e in events[at:at + n]:
            key = (e.ts, len(stored))  # the store's order: time, then ingest
            inc.add(key, e)
            stored.append((key, e))
        at += n
        latest = max(e.ts for _, e in stored)
        for _ in range(data.draw(st.integers(1, 2), label="asks")):
            now = latest + data.draw(st.sampled_from([-30.0, -2.0, 0.0, 0.0, 0.5, 3.0, 600.0]),
                                     label="now")
            want = attribute_job([e for _, e in sorted(stored, key=lambda s: s[0])], now=now)
            assert inc.attribute(now) == want
    assert inc.count == len(events)
    return inc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_jobs_fed_in_batches_are_attributed_as_in_one_pass(data: st.DataObject) -> None:
    events = data.draw(jobs(), label="job")
    check_fed_in_batches(data.draw(arrivals(events), label="arrival"), data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_soups_fed_in_batches_are_attributed_as_in_one_pass(data: st.DataObject) -> None:
    events = data.draw(soups(), label="soup")
    check_fed_in_batches(data.draw(arrivals(events), label="arrival"), data)


def test_a_long_running_job_resumes_where_it_stopped() -> None:
    """The common case takes the fast way: a running job's next pass lays and measures
    only what came since (counted), and still gives one pass's figures."""
    spec = JobSpec(steps=4000, step_s=1.0, progress_every=1, checkpoint_every=600,
                   failures=(InjectedFailure(at_step=1500, cause="infra"),),
                   running_until_step=3000)
    events = sorted(simulate(spec), key=lambda e: e.ts)
    inc = IncrementalAttribution()
    fed = 0
    for end in range(len(events) // 2, len(events) + 1, 97):
        for i in range(fed, end):
            inc.add((events[i].ts, i), events[i])
        fed = end
        now = events[end - 1].ts + 0.25
        assert inc.attribute(now) == attribute_job(events[:end], now=now)
    assert inc.passes >= 10
    assert inc.resumed == inc.passes - 1 and inc.measured_again == 0


def test_a_late_span_lays_again_and_a_late_save_measures_again() -> None:
    """A span landing among those laid, or a save's blocking time over spans measured,
    sends the pass back to the start (same figures); the next one resumes again."""
    spec = JobSpec(steps=400, step_s=1.0, progress_every=1, checkpoint_every=0,
                   running_until_step=300)
    events = sorted(simulate(spec), key=lambda e: e.ts)
    late = [e for e in events if isinstance(e, Progress)][100]
    events.remove(late)
    inc = IncrementalAttribution()
    for i, e in enumerate(events):
        inc.add((e.ts, i), e)
    now = events[-1].ts + 1
    inc.attribute(now)
    inc.add((late.ts, len(events)), late)
    assert inc.attribute(now) == attribute_job([*events, late], now=now)
    assert inc.resumed == 0  # laid again from the start
    assert inc.attribute(now + 1) == attribute_job([*events, late], now=now + 1)
    assert inc.resumed == 1
    from airflow_ett.ett.events import CheckpointSaved

    save = CheckpointSaved(id="late-save", job=spec.job, ts=now, attempt="1",
                           start_ts=late.start_ts, step=1, cursor=1, blocking_s=2.0,
                           total_s=3.0)
    inc.add((save.ts, len(events) + 1), save)
    assert inc.attribute(now + 2) == attribute_job([*events, late, save], now=now + 2)
    assert inc.resumed == 2 and inc.measured_again == 1


def test_a_finished_job_is_kept_until_an_event_comes() -> None:
    events = simulate(JobSpec(steps=50))
    inc = IncrementalAttribution()
    for i, e in enumerate(events):
        inc.add((e.ts, i), e)
    first = inc.attribute(1.0)
    assert inc.attribute(2.0) is first and inc.passes == 1
    assert first == attribute_job(events)


@st.composite
def rank_streams(draw: st.DrawFn) -> list[RankSteps]:
    """Every rank's reports, attempt after attempt, one or two ranks slow as often as not
    (as slow: a tie), the same first step reported twice now and then, waits of very
    different sizes (their float sum depends on its order)."""
    out: list[RankSteps] = []
    slow = draw(st.sampled_from([(), (1,), (1, 2)]))
    for attempt in draw(st.lists(st.sampled_from(["1", "2", "3"]), min_size=1, max_size=3,
                                 unique=True)):
        t = 1_800_000_000.0 + draw(st.sampled_from([0.0, 3.0, 50.0]))  # attempts may overlap
        ranks = draw(st.permutations(range(draw(st.integers(1, 4)))))
        for i in range(draw(st.integers(1, 8))):
            for rank in ranks:
                own = draw(st.sampled_from([0.9, 1.0, 1.05])) * (2.0 if rank in slow else 1.0)
                first = 10 * (i - draw(st.sampled_from([0, 0, 0, 1])))
                out.append(with_rank(RankSteps(
                    id=f"{attempt}.{i}.{rank}", job="j", ts=t, attempt=attempt,
                    start_ts=t - 1, step_start=first,
                    step_end=first + draw(st.sampled_from([5, 10, 17])), busy_s=10 * own,
                    wait_s=draw(st.sampled_from([0.0, 1e-6, 0.3, 1.7, 1e10]))), rank))
                t += draw(st.sampled_from([0.0, 0.5, 1.0]))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rank_step_times_kept_up_to_date_are_those_of_one_pass(data: st.DataObject) -> None:
    from airflow_ett.ett.attribution.live_ranks import LiveRankSteps
    from airflow_ett.ett.attribution.stragglers import rank_step_times

    events = data.draw(arrivals(data.draw(rank_streams(), label="reports")), label="arrival")
    live = LiveRankSteps()
    live.bulk_from = 1  # the first batch in bulk, as a job's first read
    stored: list[tuple[Key, RankSteps]] = []
    at = 0
    while at < len(events):
        n = data.draw(st.integers(1, 6), label="batch")
        batch = []
        for e in events[at:at + n]:
            assert isinstance(e, RankSteps)
            batch.append(((e.ts, len(stored) + len(batch)), e))
        live.extend(batch)
        stored += batch
        at += n
        assert live.times() == rank_step_times([e for _, e in sorted(stored)])


def test_an_attempt_that_turns_out_to_have_reported_first_reorders_the_waits() -> None:
    """The wait is a float sum in the order attempts first reported: a late report that
    moves an attempt ahead sums it again in the new order."""
    from airflow_ett.ett.attribution.live_ranks import LiveRankSteps
    from airflow_ett.ett.attribution.stragglers import rank_step_times

    def report(attempt: str, ts: float, first: int, wait_s: float) -> RankSteps:
        return RankSteps(id=f"{attempt}@{ts}", job="j", ts=1_800_000_000.0 + ts,
                         attempt=attempt, start_ts=1_799_999_999.0 + ts, step_start=first,
                         step_end=first + 10, busy_s=10.0, wait_s=wait_s)

    # 1e16 us and 1 us: their float sum depends on the order
    arrived = [report("a", 15, 0, 0.0), report("b", 20, 0, 0.0), report("a", 25, 10, 1e10),
               report("b", 30, 10, 1e-6), report("a", 35, 20, 0.0), report("b", 40, 20, 1e-6),
               report("b", 10, 30, 1e-6)]  # b's report of its latest steps, sent first, late
    live = LiveRankSteps()
    stored: list[tuple[Key, RankSteps]] = []
    for e in arrived:
        key = (e.ts, len(stored))
        live.add(key, e)
        stored.append((key, e))
        assert live.times() == rank_step_times([x for _, x in sorted(stored)])


def test_a_save_reported_late_between_spans_keeps_the_measure() -> None:
    """A save's blocking time lands between spans (the loop waited): no span's effective
    time moved, so the spans measured stay measured."""
    from airflow_ett.ett.events import CheckpointSaved

    spec = JobSpec(steps=400, step_s=1.0, progress_every=1, checkpoint_every=100,
                   running_until_step=300)
    events = sorted(simulate(spec), key=lambda e: e.ts)
    save = next(e for e in events if isinstance(e, CheckpointSaved))
    events.remove(save)
    inc = IncrementalAttribution()
    for i, e in enumerate(events):
        inc.add((e.ts, i), e)
    now = events[-1].ts + 1
    inc.attribute(now)
    inc.add((save.ts, len(events)), save)
    assert inc.attribute(now) == attribute_job([*events, save], now=now)
    assert inc.resumed == 1 and inc.measured_again == 0
