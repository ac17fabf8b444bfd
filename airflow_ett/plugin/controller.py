"""The preemption controller: reads the fleet, asks `victims.choose`, asks the victims to
yield. `airflow-ett preemption run` runs it as a process of its own (decision 0015 says
why there, not in the scheduler or a DAG).

One tick: the tenants file in force (none, or `[scheduling] preemption = false`: decide,
log, act on nothing); the train tasks in the tenants' pools from Airflow's metadata
database (read-only, one query, like the scheduler's own); the running ones' live state
from the ETT store; `scheduling.snapshot.fleet_state`, then `victims.choose`. Each victim
gets a request in its job directory (`scheduling/request.py`), unless one is pending
already (it is yielding); its train task does the rest (checkpoint, reschedule without a
retry). A request still pending well past its grace is reported: the victim's worker may
be gone, and Airflow's own heartbeat handling will end that task.

If the controller stops, nothing is preempted and Airflow schedules as it always does:
the failure mode is the stock behaviour, never a lost job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from airflow_ett.scheduling.model import Decision, FleetState
    from airflow_ett.scheduling.snapshot import TaskState, TrainTask
    from airflow_ett.scheduling.tenants import TenantsConfig
    from airflow_ett.store import EttStore

log = logging.getLogger(__name__)

#: A pending request this long past its grace is reported as not acted on.
OVERDUE_MARGIN_S = 30.0


@dataclass
class Tick:
    """What one tick saw and did (for the log, the CLI and the tests)."""

    state: FleetState | None = None
    decisions: list[Decision] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)  # victims asked to yield now
    pending: list[str] = field(default_factory=list)  # victims still yielding
    overdue: list[str] = field(default_factory=list)
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
             now: float, tz: str = "UTC") -> FleetState:
    from airflow_ett.scheduling.live import live_state
    from airflow_ett.scheduling.snapshot import fleet_state

    day_start = _day_start(now, tz)
    live = {t.job: live_state(store.job_events(t.job), now=now, day_start=day_start)
            for t in tasks if t.state == "running"}
    return fleet_state(tasks, live, config.tenants, capacity_gpus=config.fleet_gpus, now=now)


def act(state: FleetState, decisions: Sequence[Decision], tasks: Sequence[TrainTask],
        config: TenantsConfig, work_dir: Path, *, now: float) -> Tick:
    """Leave a request for every victim that has none pending."""
    from airflow_ett.operators.job import job_paths
    from airflow_ett.scheduling.request import PreemptRequest, read_request, write_request

    tick = Tick(state=state, decisions=list(decisions))
    by_job = {t.job: t for t in tasks}
    for decision in decisions:
        for p in decision.preemptions:
            task = by_job[p.victim]
            job_dir = job_paths(work_dir, task.dag_id, task.run_id).job_dir
            policy = config.tenants[p.victim_tenant]
            pending = read_request(job_dir)
            if pending is not None:
                tick.pending.append(p.victim)
                if now > pending.requested_at + pending.grace_s + OVERDUE_MARGIN_S:
                    tick.overdue.append(p.victim)
                    log.warning("preemption of %s requested at %s has not been acted on "
                                "(grace %.0f s): is its worker alive?", p.victim,
                                time.strftime("%H:%M:%S", time.gmtime(pending.requested_at)),
                                pending.grace_s)
                continue
            if not config.preemption:
                log.info("would preempt (preemption is off in the tenants file): %s",
                         p.reason)
                continue
            write_request(job_dir, PreemptRequest(
                victim=p.victim, for_job=p.for_job, reason=p.reason, requested_at=now,
                grace_s=policy.grace_s, resume_after_s=config.resume_after_s))
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
    with EttStore(store_url) as store:
        fleet = snapshot(tasks, config, store, now=now, tz=RollupSettings.load().timezone)
    decisions = choose(fleet, order=order)  # type: ignore[arg-type]
    return act(fleet, decisions, tasks, config, EttSettings.load().work_dir, now=now)


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
