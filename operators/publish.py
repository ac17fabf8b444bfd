"""`PublishModelOperator`: ship the trained model on a CPU worker, after the GPUs are free.

Publishing inside the GPU task keeps a whole allocation idle while weights are converted
and copied (Meta measured 25-55 minutes of such shutdown). Here the train task ends (and
records `job_ended`) first; this task loads the final checkpoint on CPU and writes a
versioned, portable artifact with a manifest that carries the run's ETT summary, so the
publish time is reported as "time to model available", not GPU time. Each publish is
also an event of the DAG's model Asset (`model_asset`), whose `extra` carries the version
and the job's ETT figures, so that downstream DAGs can be scheduled on a new model.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import quote

from airflow.sdk import Asset

from airflow_ett.ett.summary import JobSummary
from airflow_ett.operators.base import EttJobOperator, EttTrainerOperator
from airflow_ett.operators.errors import TrainerConfigError
from airflow_ett.operators.job import JobConfigError, JobPaths, reader
from airflow_ett.trainer.config import ConfigError, TrainerConfig

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.sdk.types import Logger
    from pydantic import JsonValue


class PublishedModel(TypedDict):
    """What a publish returns (the publish task's XCom): the artifact's folder, its
    version and its manifest file."""

    path: str
    version: int
    manifest: str


class ModelAnnouncement(PublishedModel):
    """The `extra` of the model asset's event (`announce`): the model published, by which
    job, from which checkpoint step, and the job's ETT figures (`JobSummary.compact`)."""

    job: str
    step: int
    ett: dict[str, object] | None


def ett_summary(job: str, log: Logger) -> JobSummary | None:
    """The job's ETT so far, for the manifest; None when the store cannot say (publishing
    must not fail because the measurement is unavailable)."""
    try:
        from airflow_ett.store import EttStore

        with EttStore() as store:  # the [ett] store_url
            return store.job_summary(job)
    except Exception as exc:
        log.warning("no ETT summary for %s in the manifest: %s", job, exc)
        return None


def publish_job(op: EttTrainerOperator, context: Context,
                prepared: tuple[JobPaths, TrainerConfig] | None = None) -> PublishedModel:
    """Publish the job's newest checkpoint; shared by this operator and the baseline's
    in-GPU publish (which passes the config it already `prepared`), so both write the
    same artifact."""
    if prepared is None:
        try:
            prepared = op.prepare(context)
        except JobConfigError as exc:
            raise TrainerConfigError(str(exc)) from None
    paths, cfg = prepared
    from airflow_ett.trainer.publish import publish_model

    job = op.job_id(context)
    dag_id, run_id = op.run_ids(context)
    summary = ett_summary(job, op.log)
    ett_pct = summary.ett_pct if summary is not None else None
    try:
        published = publish_model(
            cfg, paths.models_dir,
            metrics={"ett_pct": ett_pct} if ett_pct is not None and math.isfinite(
                ett_pct) else None,
            ett_summary=summary.compact() if summary is not None else None,
            extra={"job": job, "dag_id": dag_id, "run_id": run_id},
        )
    except ConfigError as exc:  # e.g. another model's checkpoints: a retry cannot help
        raise TrainerConfigError(str(exc)) from None
    op.emitter(context).model_published(uri=str(published.path))
    op.log.info("published %s (checkpoint step %s, data cursor %s)", published.path,
                published.step, published.cursor)
    result: PublishedModel = {"path": str(published.path), "version": published.version,
                              "manifest": str(published.manifest_path)}
    announce(op, context, {**result, "job": job, "step": published.step,
                           "ett": summary.compact() if summary is not None else None})
    return result


def model_asset(dag_id: str) -> Asset:
    """The Airflow Asset a lifecycle job's publish updates, one per DAG: schedule a
    downstream DAG on it (`schedule=[model_asset("ranking_ctr_v7")]`) to run on each new
    model version; the event's `extra` says which (`announce`)."""
    return Asset(name=f"ett-model/{dag_id}", uri=f"ett-model://models/{quote(dag_id)}",
                 group="model")


def announce(op: EttJobOperator, context: Context, extra: ModelAnnouncement) -> None:
    """Put `extra` (the version published, its path, the job and its ETT figures) on
    the asset event of each model asset the task updates (its `outlets`)."""
    events = context.get("outlet_events")
    if events is None:
        return
    for outlet in op.outlets:
        if isinstance(outlet, Asset) and outlet.uri.startswith("ett-model://"):
            events[outlet].extra = {str(k): _json_safe(v) for k, v in extra.items()}


def _json_safe(value: object) -> JsonValue:
    """`value` with every non-finite float as None: an asset event's extra is JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, str | int):  # bool is an int
        return value
    raise TypeError(f"not a JSON value: {type(value).__name__}")  # the extra is JSON


class PublishModelOperator(EttTrainerOperator):
    """Load the final checkpoint on CPU and write a versioned model artifact."""

    ett_role = "publish"
    ui_color = "#efe3fa"

    def __init__(self, *, queue: str = "cpu", **kwargs: Any) -> None:
        super().__init__(queue=reader(type(self).__name__).text("queue", queue), **kwargs)

    def execute(self, context: Context) -> PublishedModel:
        result = publish_job(self, context)
        self.emitter(context).flush()
        return result
