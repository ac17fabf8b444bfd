"""The nightly fleet rollup as an Airflow DAG: `fleet_rollup_dag()` builds it,
`nightly_rollup(day)` is what its one task does.

Each run is for one calendar day in `[ett] rollup_timezone` (its data interval: the day,
local midnight to midnight; the run starts when the day is over). It recomputes that day
and the `rollup_recompute_days - 1` days before it, so that events arriving late (a spool
replayed after an outage, a worker that reported hours later) correct the days they
belong to, then rewrites each of those days' report files under `<report_dir>/<date>/`.
Rerunning a run replaces its days whole: idempotent. Then the run's day is judged
against the components file's SLOs and its baseline days, and its alerts go to the
notifiers the file names (`operators/notify.py`, decision 0029), each one once: the
store records what went. Catchup is on but bounded: the DAG
starts `rollup_catchup_days` before today, so a scheduler that was down a week catches up
on at most that many days; older ones are a `airflow backfill create` or an
`airflow-ett rollup --from --to` away. The DAG carries no `ett` tag, so the listeners do
not record it as a training job, and its task runs on the `cpu` queue.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk import DAG, Context

    from airflow_ett.rollup.alerts import Alert
    from airflow_ett.rollup.components import ComponentsConfig
    from airflow_ett.store import EttStore

log = logging.getLogger(__name__)

ROLLUP_DAG_ID = "ett_fleet_rollup"
CPU_QUEUE = "cpu"
#: The fleet page under Airflow's base URL (the plugin mounts its app at `/ett`:
#: `plugin/web/views.URL_PREFIX`, which operators/ may not import).
FLEET_PAGE_PATH = "/ett/"


def nightly_rollup(day: dt.date, *, store_url: str | None = None,
                   now: float | None = None) -> list[str]:
    """Roll up `day` and the days before it that `rollup_recompute_days` asks for, write
    their reports; returns the report directories written, oldest first. The store is
    read here; the report files are `report/`'s, which reads no store."""
    from airflow_ett.report.files import write_day_report
    from airflow_ett.rollup import load_components, windows
    from airflow_ett.settings import RollupSettings
    from airflow_ett.store import EttStore

    settings = RollupSettings.load()
    components = load_components(settings.components_file)
    first = day - dt.timedelta(days=settings.recompute_days - 1)
    written = []
    with EttStore(store_url) as store:
        rollups = store.daily.compute(windows(first, day, settings.timezone), components,
                                      now=time.time() if now is None else now,
                                      cut_pct=settings.whatif_cut_pct,
                                      start_s=settings.whatif_start_s,
                                      silent_after_s=settings.silent_after_s)
        for rollup in rollups:
            stored = store.daily.day(rollup.day)
            if stored is None:
                raise LookupError(f"no rollup stored for {rollup.day}")
            before = store.daily.day(
                (dt.date.fromisoformat(rollup.day) - dt.timedelta(days=1)).isoformat())
            out = Path(settings.report_dir) / rollup.day
            write_day_report(out, stored, before, store.job_events)
            written.append(str(out))
        alert_day(day, components, store)
    return written


def fleet_page_url() -> str:
    """The fleet page under Airflow's `[api] base_url` (a path alone when that is not an
    absolute URL: set it, or `[alerts] fleet_url`, for links that work in a mail)."""
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback=None) or ""
    return f"{base.rstrip('/')}{FLEET_PAGE_PATH}"


def alert_day(day: dt.date, components: ComponentsConfig, store: EttStore) -> list[Alert]:
    """Judge the stored `day` against its SLOs and its baseline (the file's
    `baseline_days` stored days before it) and send its alerts to their notifiers (each
    alert and notifier once); returns the day's alerts. Raises `NotifierError` for a
    notifier the file describes wrongly, `AlertsNotSent` when some could not be sent."""
    from airflow_ett.operators.notify import load_notifiers, send_alerts
    from airflow_ett.rollup.alerts import day_alerts

    notifiers = load_notifiers(components)  # a wrong one is said every night, alerts or not
    today = store.daily.day(day.isoformat())
    if today is None:
        raise LookupError(f"no rollup stored for {day}")
    days = components.alerts.baseline_days
    baseline = store.daily.days((day - dt.timedelta(days=days)).isoformat(),
                                (day - dt.timedelta(days=1)).isoformat())
    alerts = day_alerts(today, baseline, components, fleet_url=fleet_page_url())
    for alert in alerts:
        log.info("ETT alert %s: %s", alert.key, alert.subject)
    send_alerts(alerts, notifiers, store)
    return alerts


def day_of_run(context: Context, tz: str) -> dt.date:
    """The day a run is for: `conf["date"]` when given (a manual rerun of one day), else the
    run's data interval start in `tz`; a manual run with neither is for yesterday."""
    from airflow_ett.rollup.calendar import day_of, parse_day

    dag_run = context.get("dag_run")
    conf = getattr(dag_run, "conf", None) or {}
    if conf.get("date"):
        return parse_day(str(conf["date"]), field="conf.date")
    start = context.get("data_interval_start")
    if start is not None:
        return day_of(start.timestamp(), tz)
    return day_of(time.time(), tz) - dt.timedelta(days=1)


def fleet_rollup_dag(dag_id: str = ROLLUP_DAG_ID) -> DAG:
    import pendulum
    from airflow.sdk import DAG, get_current_context, task
    from airflow.timetables.interval import CronDataIntervalTimetable

    from airflow_ett.settings import RollupSettings

    settings = RollupSettings.load()
    tz = settings.timezone
    start = pendulum.today(tz).subtract(days=settings.catchup_days)
    with DAG(
        dag_id,
        schedule=CronDataIntervalTimetable("0 0 * * *", timezone=tz),
        start_date=start,
        catchup=True,
        max_active_runs=1,
        tags=["ett-fleet"],
        doc_md=__doc__,
        params={},
    ) as dag:

        @task(task_id="rollup_and_report", queue=CPU_QUEUE, retries=2,
              retry_delay=dt.timedelta(minutes=5))
        def rollup_and_report() -> list[str]:
            """Roll up the run's day (and the days before it that late events may have
            changed) into the ett_daily_* tables; write each day's report files."""
            return nightly_rollup(day_of_run(get_current_context(), tz))

        rollup_and_report()
    return dag
