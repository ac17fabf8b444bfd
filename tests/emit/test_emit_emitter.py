"""The caller-facing API: what each method records, phases, ids, disabled, the default."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from airflow_ett.emit import Emitter, get_emitter, reset_default_emitter
from airflow_ett.ett.events import (
    AttemptEnded,
    AttemptStarted,
    CheckpointSaved,
    JobEnded,
    JobSubmitted,
    ModelPublished,
    PhaseEnded,
    PhaseStarted,
    Progress,
)
from tests.emit.conftest import ControlledSink, CountingSink, Destination, spool_files
from tests.factories import T0 as T


def make(sink: object, spool_dir: Path, **kwargs: object) -> Emitter:
    kwargs.setdefault("emit_timeout", 5.0)
    return Emitter(kwargs.pop("job_id", "job-1"), kwargs.pop("attempt_id", "att-1"),  # type: ignore[arg-type]
                   sink=sink, spool_dir=spool_dir, **kwargs)  # type: ignore[arg-type]


def test_events_reach_the_sink_in_order_with_all_fields(dest: Destination,
                                                        spool_dir: Path) -> None:
    sink = ControlledSink(dest.sink())
    em = make(sink, spool_dir, batch_size=3)  # several batches: order must hold across them
    em.job_submitted(tenant="ads", model="dlrm", dag_id="d", run_id="r", attrs={"k": 1},
                     ts=T + 100.0)
    em.attempt_started(host="h1", ts=T + 101.0)
    with em.phase("model_creation"):
        pass
    em.phase_start("my_phase", component="initialization", ts=T + 102.0)
    em.phase_end("my_phase", ts=T + 103.0)
    em.progress(0, 10, 0, 640, start_ts=T + 104.0, end_ts=T + 105.0, loss=0.5)
    em.checkpoint(10, 640, start_ts=T + 105.0, blocking_s=0.25, total_s=2.0, bytes=123,
                  final=True, ts=T + 107.0)
    em.attempt_ended("failed", cause="preemption", detected_ts=T + 107.5, exit_code=143,
                     message="preempted", ts=T + 108.0)
    em.job_ended("failed", ts=T + 109.0)
    em.model_published("s3://m", ts=T + 110.0)
    assert em.flush()
    em.close()

    sent = [i for call in sink.calls for i in call]
    stored = {e.id: e for e in dest.events("job-1")}
    assert sorted(sent) == sorted(stored)
    assert len(sent) == len(stored) == 11 and len(set(sent)) == 11
    events = [stored[i] for i in sent]
    kinds = [type(e) for e in events]
    assert kinds == [JobSubmitted, AttemptStarted, PhaseStarted, PhaseEnded, PhaseStarted,
                     PhaseEnded, Progress, CheckpointSaved, AttemptEnded, JobEnded,
                     ModelPublished]
    assert events[0] == JobSubmitted(id=sent[0], job="job-1", ts=T + 100.0, tenant="ads",
                                     model="dlrm", dag_id="d", run_id="r", attrs={"k": 1})
    assert events[1] == AttemptStarted(id=sent[1], job="job-1", ts=T + 101.0, attempt="att-1",
                                       host="h1")
    start, end = events[2], events[3]
    assert isinstance(start, PhaseStarted) and isinstance(end, PhaseEnded)
    assert (start.phase, end.phase, start.attempt) == ("model_creation", "model_creation",
                                                       "att-1")
    assert start.span and start.span == end.span and end.ts >= start.ts
    assert isinstance(events[4], PhaseStarted) and isinstance(events[5], PhaseEnded)
    assert events[4].component == "initialization" and events[4].span == events[5].span
    assert (events[4].ts, events[5].ts) == (T + 102.0, T + 103.0)
    assert events[6] == Progress(id=sent[6], job="job-1", ts=T + 105.0, attempt="att-1",
                                 start_ts=T + 104.0, step_start=0, step_end=10, cursor_start=0,
                                 cursor_end=640, loss=0.5)
    assert events[7] == CheckpointSaved(id=sent[7], job="job-1", ts=T + 107.0, attempt="att-1",
                                        start_ts=T + 105.0, step=10, cursor=640, blocking_s=0.25,
                                        total_s=2.0, bytes=123, final=True)
    assert events[8] == AttemptEnded(id=sent[8], job="job-1", ts=T + 108.0, attempt="att-1",
                                     status="failed", cause="preemption", detected_ts=T + 107.5,
                                     exit_code=143, message="preempted")
    assert events[9] == JobEnded(id=sent[9], job="job-1", ts=T + 109.0, status="failed")
    assert events[10] == ModelPublished(id=sent[10], job="job-1", ts=T + 110.0, uri="s3://m")
    assert not spool_files(spool_dir)


def test_phase_end_is_recorded_when_the_block_raises(spool_dir: Path) -> None:
    sink = CountingSink()
    em = make(sink, spool_dir)
    with pytest.raises(RuntimeError), em.phase("checkpoint_restore"):
        raise RuntimeError("restore failed")
    em.close()
    assert [type(e) for e in sink.events] == [PhaseStarted, PhaseEnded]


def test_concurrent_and_nested_phases_pair_by_span(spool_dir: Path) -> None:
    sink = CountingSink()
    em = make(sink, spool_dir)
    threads, per_thread = 8, 40
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait()
        for _ in range(per_thread):
            with em.phase("data_pipeline_init"), em.phase("data_pipeline_init"):
                time.sleep(0)
            span = em.phase_start("model_creation")
            em.phase_end("model_creation", span)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert em.close()

    starts = {e.span: e for e in sink.events if isinstance(e, PhaseStarted)}
    ends = {e.span: e for e in sink.events if isinstance(e, PhaseEnded)}
    n = threads * per_thread * 3
    assert len(starts) == len(ends) == n  # every span unique, none lost
    assert starts.keys() == ends.keys()
    for span, start in starts.items():
        assert ends[span].phase == start.phase and ends[span].ts >= start.ts
    assert all(count == 1 for count in sink.counts.values())


def test_phase_end_without_span_closes_the_latest_open_one(spool_dir: Path) -> None:
    sink = CountingSink()
    em = make(sink, spool_dir)
    outer = em.phase_start("stall")
    inner = em.phase_start("stall")
    em.phase_end("stall")
    em.phase_end("stall")
    em.close()
    ends = [e.span for e in sink.events if isinstance(e, PhaseEnded)]
    assert ends == [inner, outer]


def test_ids_are_unique_across_threads_and_emitters(spool_dir: Path) -> None:
    sinks = [CountingSink(), CountingSink()]
    ems = [make(s, spool_dir / str(i)) for i, s in enumerate(sinks)]

    def work(em: Emitter) -> None:
        for i in range(2000):
            em.progress(i, i + 1, i, i + 1, start_ts=T + 1.0, end_ts=T + 2.0)

    pool = [threading.Thread(target=work, args=(em,)) for em in ems for _ in range(3)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for em in ems:
        assert em.close()
    ids = [e.id for s in sinks for e in s.events]
    assert len(ids) == 12_000 == len(set(ids))


def test_disabled_is_a_cheap_no_op(spool_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = set(threading.enumerate())
    sink = CountingSink()
    em = Emitter("j", "a", sink=sink, spool_dir=spool_dir, disabled=True)
    for i in range(2_000):
        em.progress(i, i + 1, i, i + 1, start_ts=T + 1.0)
        with em.phase("stall"):
            pass
    em.job_submitted()
    em.attempt_ended("failed", cause="infra")
    em.emit(JobEnded(id="x", job="j", ts=T + 1.0, status="success"))
    assert em.flush() and em.close()
    assert not em.enabled
    assert set(threading.enumerate()) - before == set()  # no thread was started
    assert sink.events == [] and not spool_dir.exists()
    # (its cost per call is measured by bench/emitter.py, not asserted here)

    monkeypatch.setenv("AIRFLOW__ETT__DISABLED", "true")
    monkeypatch.setenv("ETT_JOB_ID", "j")
    reset_default_emitter()
    assert not get_emitter().enabled


def test_get_emitter_is_one_per_process_and_reads_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dest: Destination) -> None:
    monkeypatch.setenv("AIRFLOW__ETT__STORE_URL", dest.spec if dest.spec.startswith(
        "sqlite") else "sqlite:///" + str(tmp_path / "unused.db"))
    monkeypatch.setenv("AIRFLOW__ETT__SPOOL_DIR", str(tmp_path / "sp"))
    monkeypatch.setenv("AIRFLOW__ETT__EMIT_TIMEOUT", "3")
    monkeypatch.setenv("ETT_JOB_ID", "env-job")
    monkeypatch.setenv("ETT_ATTEMPT_ID", "env-att")
    reset_default_emitter()
    seen: list[Emitter] = []
    barrier = threading.Barrier(6)

    def grab() -> None:
        barrier.wait()
        seen.append(get_emitter())

    pool = [threading.Thread(target=grab) for _ in range(6)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert len({id(e) for e in seen}) == 1
    em = seen[0]
    assert (em.job_id, em.attempt_id, em.enabled) == ("env-job", "env-att", True)
    assert em.writer is not None and em.writer.emit_timeout == 3.0
    assert em.writer.spool_dir == tmp_path / "sp"


def test_bound_views_share_one_writer(spool_dir: Path) -> None:
    sink = CountingSink()
    em = Emitter(sink=sink, spool_dir=spool_dir, emit_timeout=5.0)  # no job of its own
    before = set(threading.enumerate())
    a = em.bind("job-a", "a1")
    b = em.bind("job-b", "b1")
    assert set(threading.enumerate()) - before == set()
    a.attempt_started(host="x")
    b.attempt_started(host="y")
    em.progress(0, 1, 0, 1, start_ts=T + 1.0)  # no job: logged, not recorded
    assert b.close()  # a view's close only flushes
    assert em.writer is not None and not em.writer._stopping
    em.close()
    assert sorted((e.job, getattr(e, "attempt", None)) for e in sink.events) == [
        ("job-a", "a1"), ("job-b", "b1")]


def test_missing_job_id_is_logged_not_raised(spool_dir: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    sink = CountingSink()
    em = Emitter(sink=sink, spool_dir=spool_dir, emit_timeout=5.0)
    for _ in range(50):
        em.attempt_started()
        em.job_ended("success")
    em.close()
    assert sink.events == []
    assert len([r for r in caplog.records if "no job or attempt id" in r.message]) == 1


def test_invalid_events_are_kept_aside_not_sent(spool_dir: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    sink = CountingSink()
    em = make(sink, spool_dir)
    em.attempt_ended("failed")  # a failure needs a cause
    em.progress(5, 1, 0, 1, start_ts=T + 1.0)  # steps go backwards
    em.progress(0, 1, 0, 1, start_ts=T + 1.0, loss="low")  # type: ignore[arg-type]
    em.job_ended("success")
    em.close()
    assert [type(e) for e in sink.events] == [JobEnded]
    rejected = list(spool_dir.glob("invalid-*.rejected"))
    assert len(rejected) == 1
    lines = rejected[0].read_text().splitlines()
    assert len(lines) == 3 and "cause" in lines[0] and "step_end" in lines[1]
    assert em.stats().rejected == 3
    assert any("invalid event" in r.message for r in caplog.records)


def test_close_is_idempotent_and_later_events_go_to_the_spool(spool_dir: Path) -> None:
    sink = CountingSink()
    em = make(sink, spool_dir)
    em.job_ended("success")
    assert em.close() and em.close()
    em.job_ended("cancelled")  # after close: not lost, spooled
    assert em.flush()
    assert len(sink.events) == 1
    (path,) = spool_files(spool_dir)
    assert '"cancelled"' in path.read_text()


def test_the_caller_never_sees_an_exception(spool_dir: Path) -> None:
    class Exploding:
        def write(self, events: object) -> None:
            raise MemoryError("boom")

    em = make(Exploding(), spool_dir, emit_timeout=0.5)
    em.progress("a", None, object(), 1, start_ts="x")  # type: ignore[arg-type]
    em.job_ended("success")
    em.close()


def _one_of_each(em: Emitter) -> None:
    """Everything an attempt's process records: own events and the job's."""
    em.attempt_started(host="h")
    with em.phase("compile", "compilation"):
        pass
    span = em.phase_start("model_creation")
    em.progress(0, 5, 0, 640, start_ts=T + 1.0)
    em.checkpoint(5, 640, T + 2.0, 0.01, 0.2)
    em.phase_end("model_creation", span)
    em.emit(Progress(id=em.new_id(), job="j", ts=T + 3.0, attempt="1", step_start=5,
                     step_end=6, cursor_start=640, cursor_end=768, start_ts=T + 2.5))
    em.attempt_ended("success", exit_code=0)


@pytest.mark.parametrize("bound", [False, True])
def test_a_rank_other_than_0_reports_its_own_events_stamped_and_nothing_of_the_jobs(
        spool_dir: Path, bound: bool) -> None:
    sink = CountingSink()
    em = Emitter("j", "1", sink=sink, spool_dir=spool_dir, emit_timeout=5.0, rank=2)
    _one_of_each(em.bind() if bound else em)  # a bound view keeps the rank
    em.close()
    kinds = [type(e).__name__ for e in sink.events]
    assert kinds == ["AttemptStarted", "PhaseStarted", "PhaseEnded", "PhaseStarted",
                     "PhaseEnded", "AttemptEnded"]
    assert {(e.rank, e.v) for e in sink.events} == {(2, 2)}


def test_rank_0_reports_everything_unstamped(spool_dir: Path) -> None:
    sink = CountingSink()
    em = Emitter("j", "1", sink=sink, spool_dir=spool_dir, emit_timeout=5.0)
    _one_of_each(em)
    em.close()
    kinds = [type(e).__name__ for e in sink.events]
    assert kinds.count("Progress") == 2 and kinds.count("CheckpointSaved") == 1
    assert len(kinds) == 9 and {e.rank for e in sink.events} == {0}


@pytest.mark.parametrize("rank", [-1, 1.0, True, "1"])
def test_a_bad_rank_is_refused_with_its_value(rank: object) -> None:
    with pytest.raises(ValueError, match=f"rank must be an int >= 0, got {rank!r}"):
        Emitter("j", "1", sink=CountingSink(), rank=rank)  # type: ignore[arg-type]
