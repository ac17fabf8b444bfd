"""The train task's trace context, handed to the trainer it starts (docs/tracing.md).

With Airflow's `[traces] otel_on`, the task process runs inside its span
`worker.<task_id>`, a child of `task_run.<task_id>` under the DAG run's `dag_run.<dag_id>`
(Airflow's task runner opens it around the whole task, execute included). The trainer's
attempt spans go under it, so a trace backend shows one waterfall from the run's queueing
to each attempt's first effective step. The context crosses the process boundary as
OpenTelemetry's environment carriers `TRACEPARENT` and `TRACESTATE` (torchrun passes the
environment on to its ranks; rank 0 traces). Where to export comes with the task's own
environment; when that names no OTLP endpoint, Airflow's `[traces] otel_host` and
`otel_port` do, as Airflow itself derives it (`http[s]://host:port/v1/traces`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Final

TRACEPARENT_ENV: Final = "TRACEPARENT"
TRACESTATE_ENV: Final = "TRACESTATE"
ENDPOINT_ENVS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def trainer_trace_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What the trainer's environment gets so that its spans nest under this task's
    span: nothing unless `[traces] otel_on` and a span is current; `environ` is the
    task's environment (default: this process's)."""
    from airflow.configuration import conf

    if not conf.getboolean("traces", "otel_on", fallback=False):
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    if "traceparent" not in carrier:
        return {}
    env = {TRACEPARENT_ENV: carrier["traceparent"]}
    if carrier.get("tracestate"):
        env[TRACESTATE_ENV] = carrier["tracestate"]
    task_env = os.environ if environ is None else environ
    if not any(task_env.get(name) for name in ENDPOINT_ENVS):
        host = conf.get("traces", "otel_host", fallback="")
        port = conf.get("traces", "otel_port", fallback="")
        if host and port:
            scheme = "https" if conf.getboolean("traces", "otel_ssl_active",
                                                fallback=False) else "http"
            host = f"[{host}]" if ":" in host and not host.startswith("[") else host
            env[ENDPOINT_ENVS[0]] = f"{scheme}://{host}:{port}/v1/traces"
    return env
