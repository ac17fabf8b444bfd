"""What can go wrong with an embedded Airflow: each message says why and where (a log tail,
the task states, the import error), so the CLI can show it as it is."""

from __future__ import annotations


class EmbeddedAirflowError(RuntimeError):
    """The embedded Airflow could not do what was asked; the message says why and where."""


class ComponentDied(EmbeddedAirflowError):
    """A component process exited while it was still needed; the message holds its log tail."""


class DagImportError(EmbeddedAirflowError):
    """The DAG never appeared, or its file failed to import (the message holds the error)."""


class RunTimeout(EmbeddedAirflowError):
    """A DAG run was not finished in time; the message holds task states and the scheduler log."""
