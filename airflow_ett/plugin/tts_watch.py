"""A job past its tenant's time-to-start bound, flagged while it still waits.

How: Airflow's own deadline alerts. For a lifecycle DAG whose tenant has `max_tts_s`, the
cluster policy adds a `DeadlineAlert` measured from the DAG run's `queued_at` (our
submission: where TTS starts) with that interval (`deadline_alert`). Airflow keeps the
deadline in its database, so it survives a scheduler restart and needs no timer of
ours; if the run ends first, Airflow drops it. When the scheduler finds it missed, the
triggerer runs `time_to_start_passed`: it reads the job from the ETT store, and if the job
still has no effective step, records a `JobFlag` (the run page shows it) and sends a
message to the components file's `[alerts] tts_notify` notifiers (`notify` when it has
none), once per job. A job that has started by then is left alone: a DAG run that is
simply long is not late to start.

Why a deadline and not the listener: a job that waits makes no event (no task runs, no
hook fires), so no listener is called at the moment the bound runs out; the deadline is
exactly a timer on the run, kept by Airflow.

The store and the notifiers are blocking; the callback hands them to a thread, so the
triggerer's event loop (shared with every deferred task) never waits on them.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import html
import logging
import time
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import msgspec

from airflow_ett.ett.flags import JobFlag

if TYPE_CHECKING:
    from airflow.sdk.definitions.deadline import DeadlineAlert

log = logging.getLogger(__name__)

#: The callback's import path, as Airflow stores it with the deadline.
CALLBACK: Final = "airflow_ett.plugin.tts_watch.time_to_start_passed"
#: The name the policy gives the deadline (and replaces, when it runs again).
DEADLINE_NAME: Final = "ett_time_to_start"


def deadline_alert(tenant: str, bound_s: float) -> DeadlineAlert:
    """The deadline the cluster policy puts on a lifecycle DAG of `tenant`."""
    from airflow.sdk.definitions.callback import AsyncCallback
    from airflow.sdk.definitions.deadline import DeadlineAlert, DeadlineReference

    return DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT,
                         interval=dt.timedelta(seconds=bound_s),
                         callback=AsyncCallback(CALLBACK, kwargs={"tenant": tenant,
                                                                  "bound_s": bound_s}),
                         name=DEADLINE_NAME)


class StartAlert(msgspec.Struct, frozen=True, kw_only=True):
    """The message of a time-to-start flag (what `operators.notify.send_alerts` sends)."""

    flag: JobFlag
    dag_id: str
    run_id: str
    link: str
    notify: list[str]

    @property
    def key(self) -> str:
        return f"tts/{self.flag.job}"

    @property
    def subject(self) -> str:
        return (f"[ETT] {self.dag_id} run {self.run_id} ({self.flag.tenant}) has not started "
                f"training after {self.flag.waited_s / 60:.1f} min")

    def lines(self) -> list[str]:
        return [f"tenant: {self.flag.tenant}", f"{self.dag_id} / {self.run_id}: "
                f"{self.flag.message}", f"run page: {self.link}"]

    @property
    def text(self) -> str:
        return "\n".join(self.lines()) + "\n"

    @property
    def html(self) -> str:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in self.lines()[:-1])
        return (f"<p>{html.escape(self.subject)}</p><ul>{items}</ul>"
                f'<p><a href="{html.escape(self.link, quote=True)}">run page</a></p>')


def run_page_url(dag_id: str, run_id: str) -> str:
    """The run's ETT breakdown page under `[api] base_url` (every character of an id
    quoted, as the pages' own links do)."""
    from airflow.configuration import conf

    from airflow_ett.plugin.web.views import URL_PREFIX

    base = (conf.get("api", "base_url", fallback=None) or "").rstrip("/")
    return f"{base}{URL_PREFIX}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def _queued_at(dag_run: dict[str, Any], deadline: dict[str, Any], bound_s: float) -> float:
    for value, shift in ((dag_run.get("queued_at"), 0.0),
                         (deadline.get("deadline_time"), -bound_s)):
        if isinstance(value, str):
            try:
                return dt.datetime.fromisoformat(value).timestamp() + shift
            except ValueError:
                continue
        if isinstance(value, dt.datetime):
            return value.timestamp() + shift
    return time.time() - bound_s


def check_time_to_start(dag_id: str, run_id: str, *, tenant: str, bound_s: float,
                        queued_at: float, now: float | None = None,
                        store_url: str | None = None) -> JobFlag | None:
    """Flag the run's job if it has no effective step yet, and send the flag once; the
    flag, or None when the job has started (or the bound has not passed)."""
    from airflow_ett.ett.flags import time_to_start_flag
    from airflow_ett.jobs import job_id_for
    from airflow_ett.operators.notify import load_notifiers, send_alerts
    from airflow_ett.rollup import load_components
    from airflow_ett.settings import RollupSettings
    from airflow_ett.store import EttStore
    from airflow_ett.store.errors import JobNotFound

    job = job_id_for(dag_id, run_id)
    now = time.time() if now is None else now
    with EttStore(store_url) as store:
        try:
            started = store.job_summary(job, now=now).started
        except JobNotFound:  # queued, and not a single event yet: it waits
            started = False
        flag = time_to_start_flag(job, started=started, tenant=tenant, bound_s=bound_s,
                                  queued_at=queued_at, now=now)
        if flag is None:
            log.info("ETT: %s started within its time-to-start bound or has started since",
                     job)
            return None
        if store.flags.raise_flag(flag):
            log.warning("ETT: %s: %s", job, flag.message)
        components = load_components(RollupSettings.load().components_file)
        names = list(components.alerts.start_notify)
        if names:
            alert = StartAlert(flag=flag, dag_id=dag_id, run_id=run_id,
                               link=run_page_url(dag_id, run_id), notify=names)
            send_alerts([alert], load_notifiers(components), store)
    return flag


async def time_to_start_passed(tenant: str, bound_s: float,
                               context: dict[str, Any] | None = None) -> str:
    """The deadline's callback (in the triggerer): `check_time_to_start` on a thread."""
    dag_run = (context or {}).get("dag_run") or {}
    deadline = (context or {}).get("deadline") or {}
    # Airflow 3.3 hands the run as its REST form (DAGRunResponse): the run id is
    # `dag_run_id` there
    dag_id, run_id = dag_run.get("dag_id"), dag_run.get("dag_run_id", dag_run.get("run_id"))
    if not isinstance(dag_id, str) or not isinstance(run_id, str):
        raise ValueError(f"time-to-start deadline: no dag_id/run_id in the context: {dag_run!r}")
    flag = await asyncio.to_thread(
        check_time_to_start, dag_id, run_id, tenant=tenant, bound_s=float(bound_s),
        queued_at=_queued_at(dag_run, deadline, float(bound_s)))
    return "started" if flag is None else f"flagged: {flag.message}"
