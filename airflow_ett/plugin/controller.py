"""The preemption controller: reads the fleet, asks `victims.choose`, asks the victims to
yield. `airflow-ett preemption run` runs it as a process of its own (decision 0015 says
why there, not in the scheduler or a DAG).

One tick: the tenants file in force (none, or `[scheduling] preemption = false`: decide,
log, act on nothing); the train tasks in the tenants' pools from Airflow's metadata
database (read-only, one query, like the scheduler's own); the running ones' live state
from the ETT store; `scheduling.snapshot.fleet_state`, then `victims.choose`. Each victim
gets a request in its job directory (`protocol/request.py`) in the decision's mode
(`now`, or `at_checkpoint` with a `leave_by`; a `now` one with the decision's
`skip_save`); its train task does the rest (checkpoint or leave at the next one, or
leave at once without saving; reschedule without a retry).

The pending requests of the running train tasks are read first, and sorted by
`snapshot.review_requests`:

- a victim with a pending request is *yielding*: it is left out of the fleet the
  decision sees, and the job it yields to, while that still waits, is shown running in
  startup on its GPUs (no second set of victims for it, none for others against them);
- **claimed**: an `at_checkpoint` request the victim's trainer took at a periodic save
  (`preempt_request.claimed.json`: it is leaving on it, once that save commits) is
  yielding too, its GPUs promised until the victim exits; it is never withdrawn nor
  escalated, only reported overdue past the bound below;
- **withdrawal**: an `at_checkpoint` request whose `for_job` no longer waits (it got GPUs
  that freed up otherwise, or its task is gone), before its `leave_by`, is taken back
  (`request.withdraw_request`: renamed to `preempt_request.<stamp>.withdrawn.json`, kept
  as history) and logged; the task lets its trainer go on (`Tick.withdrawn`). The
  trainer's claim is a rename of the same file, so one of the two wins: a withdrawal
  that finds nothing to rename (claimed meanwhile) is no error: it is logged, and the
  victim stays yielding;
- **escalation**: an `at_checkpoint` request still pending past its `leave_by` + grace +
  `snapshot.OVERDUE_MARGIN_S` (its checkpoint never came, and the task's own fall back
  to `now` at `leave_by` did not end it either) is logged and rewritten once as a `now`
  request, with `leave_by` then (`Tick.escalated`);
- **overdue**: a `now` request still pending past `leave_by` + grace + the margin is
  logged and reported (`Tick.overdue`), and nothing more: the victim's worker may be
  gone, and Airflow's own heartbeat handling ends that task (a zombie is failed and its
  slot freed). The controller never kills a task itself: it has no reach to the workers,
  and a second way to end tasks would race the first.

With `[scheduling] preemption = false` the controller writes nothing (it says what it
would do), escalates nothing, but still withdraws: a withdrawal only undoes a request.

If the controller stops, nothing is preempted and Airflow schedules as it always does:
the failure mode is the stock behaviour, never a lost job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from airflow_ett.protocol.request import PreemptRequest
    from airflow_ett.scheduling.model import Decision, FleetState
    from airflow_ett.scheduling.save_times import SavePrior
    from airflow_ett.scheduling.snapshot import TaskState, TrainTask
    from airflow_ett.scheduling.tenants import TenantsConfig
    from airflow_ett.store import EttStore

log = logging.getLogger(__name__)


@dataclass
class Tick:
    """What one tick saw and did (for the log, the CLI and the tests)."""

    state: FleetState | None = None
    decisions: list[Decision] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)  # victims asked to yield now
    pending: list[str] = field(default_factory=list)  # victims still yielding
    overdue: list[str] = field(default_factory=list)  # `now` requests nobody acted on
    withdrawn: list[str] = field(default_factory=list)  # requests taken back this tick
    escalated: list[str] = field(default_factory=list)  # at_checkpoint -> now this tick
    note: str = ""


def train_tasks(session: Any, now: float) -> list[TrainTask]:
    """The train tasks in the tenants' pools that wait or hold GPUs (one read query)."""
    import sqlalchemy as sa
    from airflow.models.taskinstance import TaskInstance as TI

    from airflow_ett.jobs import job_id_for
    from airflow_ett.scheduling.model import POOL_PREFIX
    from airflow_ett.scheduling.snapshot import TrainTask

    like = POOL_PREFIX.replace("_", "\\_") + "%"
    rows = session.execute(
        sa.select(TI.dag_id, TI.run_id, TI.state, TI.pool, TI.pool_slots, TI.scheduled_dttm,
                  TI.queued_dttm, TI.start_date)
        .where(TI.pool.like(like, escape="\\"),
               TI.state.in_(("scheduled", "queued", "running")))).all()
    out = []
    for dag_id, run_id, state, pool, slots, scheduled, queued, started in rows:
        since = started if state == "running" else (scheduled or queued)
        out.append(TrainTask(job=job_id_for(dag_id, run_id), dag_id=dag_id, run_id=run_id,
                             state=cast("TaskState", str(state)), pool=pool,
                             pool_slots=int(slots or 1),
                             since=since.timestamp() if since is not None else now))
    return out


def _day_start(now: float, tz: str) -> float:
    from airflow_ett.rollup import day_of, day_window

    return day_window(day_of(now, tz), tz).lo


def snapshot(tasks: Sequence[TrainTask], config: TenantsConfig, store: EttStore, *,
             now: float, tz: str = "UTC",
             yielding: Mapping[str, PreemptRequest] | None = None) -> FleetState:
    """The fleet state from Airflow's tasks and the store's events. A running job that has
    not saved yet takes its tenant's saves of the last `save_times.PRIOR_WINDOW_S` as how
    long its own take (read only when there is such a job)."""
    from airflow_ett.scheduling.live import live_state
    from airflow_ett.scheduling.snapshot import fleet_state, tenant_of_pool

    day_start = _day_start(now, tz)
    events = {t.job: store.job_events(t.job) for t in tasks
              if t.state == "running" and t.job not in (yielding or {})}
    live = {job: live_state(e, now=now, day_start=day_start) for job, e in events.items()}
    unsaved = [t for t in tasks if (s := live.get(t.job)) is not None and s.exit_save_s is None]
    priors = tenant_priors(store, config, now=now) if unsaved else {}
    for task in unsaved:
        prior = priors.get(tenant_of_pool(task.pool) or "")
        if prior is not None:
            live[task.job] = live_state(events[task.job], now=now, day_start=day_start,
                                        prior=prior)
    return fleet_state(tasks, live, config.tenants, capacity_gpus=config.fleet_gpus, now=now,
                       wait_price=config.checkpoint_wait_price, yielding=yielding)


def tenant_priors(store: EttStore, config: TenantsConfig, *, now: float
                  ) -> dict[str, SavePrior]:
    """Each tenant's recent saves as the guess for a job of it that has not saved yet
    (`save_times.save_prior`; a tenant without saves in the window has none)."""
    from airflow_ett.scheduling.live import save_time
    from airflow_ett.scheduling.save_times import PRIOR_WINDOW_S, save_prior

    saves = store.checkpoint_saves(config.tenants, since=now - PRIOR_WINDOW_S)
    priors = {t: save_prior([save_time(c) for c in own]) for t, own in saves.items()}
    return {t: p for t, p in priors.items() if p is not None}


def _job_dir(work_dir: Path, task: TrainTask) -> Path:
    from airflow_ett.operators.job import job_paths

    return job_paths(work_dir, task.dag_id, task.run_id).job_dir


def pending_requests(tasks: Sequence[TrainTask], work_dir: Path) -> dict[str, PreemptRequest]:
    """The pending request of each running train task that has one (victim job -> it)."""
    from airflow_ett.protocol.request import read_request

    return _each_running(tasks, work_dir, read_request)


def claimed_requests(tasks: Sequence[TrainTask], work_dir: Path) -> dict[str, PreemptRequest]:
    """The request each running train task's trainer claimed to leave on, if any."""
    from airflow_ett.protocol.request import read_claimed

    return _each_running(tasks, work_dir, read_claimed)


def _each_running(tasks: Sequence[TrainTask], work_dir: Path,
                  read: Callable[[Path], PreemptRequest | None]) -> dict[str, PreemptRequest]:
    found: dict[str, PreemptRequest] = {}
    for task in tasks:
        if task.state == "running":
            request = read(_job_dir(work_dir, task))
            if request is not None:
                found[task.job] = request
    return found


def settle_requests(tasks: Sequence[TrainTask], config: TenantsConfig, work_dir: Path, *,
                    now: float) -> tuple[dict[str, PreemptRequest], Tick]:
    """Read and sort the pending requests (`snapshot.review_requests`; a claimed one in
    place of a pending one: the trainer is leaving on it), withdraw and escalate as it
    says; returns the yielding victims' requests and what was done (a Tick without a
    state yet)."""
    from airflow_ett.protocol.request import withdraw_request, write_request
    from airflow_ett.scheduling.snapshot import review_requests

    claimed = claimed_requests(tasks, work_dir)
    pending = {**pending_requests(tasks, work_dir), **claimed}
    review = review_requests(pending, tasks, now=now, claimed=claimed.keys())
    tick = Tick()
    by_job = {t.job: t for t in tasks}
    for victim, request in review.withdraw.items():
        aside = withdraw_request(_job_dir(work_dir, by_job[victim]), now=now)
        if aside is None:  # the trainer claimed it since it was read: it is leaving on it
            review.yielding[victim] = request
            log.info("preemption of %s not withdrawn: its trainer claimed the request "
                     "meanwhile and is leaving on it; it stays yielding", victim)
            continue
        tick.withdrawn.append(victim)
        log.warning("preemption of %s withdrawn: %s no longer waits for its GPUs (the "
                    "request is kept as %s)", victim, request.for_job, aside.name)
    for victim, request in review.escalate.items():
        if not config.preemption:
            log.info("would ask %s to yield now (preemption is off in the tenants file)",
                     victim)
            continue
        write_request(_job_dir(work_dir, by_job[victim]), request)
        tick.escalated.append(victim)
        log.warning("%s did not yield at its checkpoint by %s (grace %.0f s): asked to yield "
                    "now", victim, _clock(request.requested_at), request.grace_s)
    for victim, request in review.overdue.items():
        tick.overdue.append(victim)
        log.warning("preemption of %s requested at %s has not been acted on (grace %.0f s): "
                    "is its worker alive? Airflow's heartbeat check ends a task whose worker "
                    "is gone", victim, _clock(request.requested_at), request.grace_s)
    tick.pending = sorted(review.yielding)
    return review.yielding, tick


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def act(state: FleetState, decisions: Sequence[Decision], tasks: Sequence[TrainTask],
        config: TenantsConfig, work_dir: Path, *, now: float, tick: Tick | None = None
        ) -> Tick:
    """Leave a request for every victim chosen (yielding ones are not in the state the
    decisions saw, so none has one pending); `tick` carries what `settle_requests` did."""
    from airflow_ett.protocol.request import PreemptRequest, leave_by_for, write_request

    tick = tick if tick is not None else Tick()
    tick.state, tick.decisions = state, list(decisions)
    by_job = {t.job: t for t in tasks}
    for decision in decisions:
        for p in decision.preemptions:
            if not config.preemption:
                log.info("would preempt (preemption is off in the tenants file): %s",
                         p.reason)
                continue
            policy = config.tenants[p.victim_tenant]
            write_request(_job_dir(work_dir, by_job[p.victim]), PreemptRequest(
                victim=p.victim, for_job=p.for_job, reason=p.reason, requested_at=now,
                grace_s=policy.grace_s, resume_after_s=config.resume_after_s, mode=p.mode,
                leave_by=leave_by_for(p.mode, now, p.yield_in_s),
                skip_save=p.skip_save))
            tick.requested.append(p.victim)
            log.warning("%s", p.reason)
    return tick


def tick_once(*, now: float | None = None, store_url: str | None = None,
              order: str = "stage_aware") -> Tick:
    """One look at the fleet and what it asked (see the module docstring)."""
    from airflow.utils.session import create_session

    from airflow_ett.scheduling import tenants
    from airflow_ett.scheduling.victims import choose
    from airflow_ett.settings import EttSettings, RollupSettings
    from airflow_ett.store import EttStore

    now = time.time() if now is None else now
    path = tenants.tenants_file_from_settings()
    if path is None:
        return Tick(note="no [ett] tenants_file: nothing to do")
    state_of_file = tenants.current(path)
    config = state_of_file.config
    if config is None:
        return Tick(note=f"no tenant policy in force: {state_of_file.error}")
    with create_session() as session:
        tasks = train_tasks(session, now)
    work_dir = EttSettings.load().work_dir
    yielding, tick = settle_requests(tasks, config, work_dir, now=now)
    with EttStore(store_url) as store:
        fleet = snapshot(tasks, config, store, now=now, tz=RollupSettings.load().timezone,
                         yielding=yielding)
    decisions = choose(fleet, order=order)  # type: ignore[arg-type]
    return act(fleet, decisions, tasks, config, work_dir, now=now, tick=tick)


def run_forever(interval_s: float, *, stop: threading.Event, store_url: str | None = None,
                on_tick: Callable[[Tick], None] | None = None) -> None:
    """Tick every `interval_s` until `stop` is set; a failing tick is logged, never fatal
    (the next one tries again: a database restart must not end the controller)."""
    while not stop.is_set():
        started = time.monotonic()
        try:
            tick = tick_once(store_url=store_url)
            if on_tick is not None:
                on_tick(tick)
        except Exception:
            log.exception("preemption controller: this tick failed; trying again")
        stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
