"""The failure history the `auto` checkpoint interval starts from
(`checkpoint_timing._history`), read through the typed `JobSummary` from a job's events
file."""

from __future__ import annotations

from pathlib import Path

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import event_to_json
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.trainer.checkpoint_timing import _history
from airflow_ett.trainer.config import TrainerConfig, config_from_mapping

SPEC = JobSpec(job="hist", steps=20, checkpoint_every=4, checkpoint_blocking_s=2.0,
               failures=(InjectedFailure(at_step=9, cause="infra"),))


def _cfg(tmp_path: Path, events: Path) -> TrainerConfig:
    return config_from_mapping({"model": "dlrm_tiny", "steps": 10,
                                "checkpoint_dir": str(tmp_path / "c"),
                                "events_file": str(events)})


def test_history_from_the_events_file(tmp_path: Path) -> None:
    events = simulate(SPEC)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(event_to_json(e) + "\n" for e in events))
    s = attribute_job(events).summary()
    assert s.checkpoints.saves > 0 and s.failure_count == 1
    assert _history(_cfg(tmp_path, path), "hist") == (
        s.effective_s, 1, s.csbt_s / s.checkpoints.saves)
    assert _history(_cfg(tmp_path, path), "other") == (0.0, 0, None)
