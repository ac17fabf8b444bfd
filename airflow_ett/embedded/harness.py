"""`EmbeddedAirflow`: one Airflow installation in a directory, driven from the outside.

It ties the parts together: the environment (`config`), the component processes
(`processes`), the REST API (`rest`, `health`), and adds what a demo or a test asks of a
running Airflow: migrate, wait until ready, wait for a DAG, trigger and wait for a run.
"""

from __future__ import annotations

import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

from airflow_ett._proc import run as run_tree
from airflow_ett.embedded.auth import admin_password
from airflow_ett.embedded.config import airflow_executable, component_env, free_port, venv_script
from airflow_ett.embedded.errors import DagImportError, EmbeddedAirflowError, RunTimeout
from airflow_ett.embedded.health import unhealthy
from airflow_ett.embedded.processes import (
    DEFAULT_COMPONENTS,
    KNOWN_COMPONENTS,
    LOG_TAIL_LINES,
    Components,
)
from airflow_ett.embedded.rest import RestClient

TERMINAL_RUN_STATES = frozenset({"success", "failed"})

#: How long `start` waits for the api-server before it starts what runs tasks.
EXECUTION_API_WAIT_S = 180.0


def runs_tasks(component: str) -> bool:
    """Whether a component runs task processes, whose first act is a call to the
    execution API: the scheduler (LocalExecutor) and any component of one's own naming (a
    Celery worker). Started together with the api-server, such a component's tasks can
    use up their start-up calls and retries before it answers (seen on a restart with
    runs queued: each task failed to start, and waited out its retry delay)."""
    return component == "scheduler" or component not in KNOWN_COMPONENTS


def _quote(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _commands(components: Sequence[str] | Mapping[str, Sequence[str]]
              ) -> dict[str, tuple[str, ...]]:
    """Component name -> its `airflow` CLI arguments; names alone must be Airflow's own."""
    if isinstance(components, Mapping):
        commands = {}
        for name, args in components.items():
            if not isinstance(name, str) or not name or "/" in name:
                raise ValueError(f"component name {name!r}: must be a non-empty name "
                                 "without '/' (it names the log file)")
            if isinstance(args, str) or not args or not all(isinstance(a, str) for a in args):
                raise ValueError(f"component {name!r}: arguments {args!r} must be a "
                                 "non-empty list of strings")
            commands[name] = tuple(args)
        return commands
    unknown = [c for c in components if c not in KNOWN_COMPONENTS]
    if unknown:
        raise ValueError(f"unknown components {unknown}; known: {sorted(KNOWN_COMPONENTS)}")
    return {name: (name,) for name in components}


class EmbeddedAirflow:
    """One Airflow installation in `home`, its components run as child processes.

    Use as a context manager (`with EmbeddedAirflow(...) as af:`): leaving the block
    stops every process, even on an exception or Ctrl-C. Constructing one starts nothing
    but creates `home` and its secrets file, since the environment depends on them.
    """

    def __init__(
        self,
        home: Path,
        dags_folder: Path,
        parallelism: int = 2,
        api_port: int | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        if parallelism < 1:
            raise ValueError(f"parallelism must be >= 1, got {parallelism}")
        self.home = Path(home).expanduser().resolve()
        self.dags_folder = Path(dags_folder).expanduser().resolve()
        self.parallelism = parallelism
        self.api_port = api_port if api_port is not None else free_port()
        self.log_dir = self.home / "logs" / "embedded"
        self.env = component_env(self.home, self.dags_folder, parallelism=parallelism,
                                 api_port=self.api_port, extra_env=extra_env or {})
        self.timings: dict[str, float] = {}
        self._components = Components(self.log_dir)
        self._rest = RestClient(self.api_url, self.home)
        self._started_utc: datetime | None = None
        self._start_called: float | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> EmbeddedAirflow:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _airflow(self, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """One `airflow` CLI command with our environment, waited for; past `timeout` its
        whole process tree is ended (not only the command: its children would live on)."""
        cmd = [str(airflow_executable()), *args]
        try:
            return run_tree(cmd, env=self.env, cwd=self.home, timeout=timeout,
                            start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedAirflowError(f"`airflow {' '.join(args)}` took over {timeout:.0f} s")\
                from exc

    def migrate(self, timeout: float = 300.0, *, ett_store: bool = True) -> None:
        """`airflow db migrate`, then `upgrade_ett_store` unless `ett_store` is False:
        creates or upgrades the metadata DB and the ETT store (a few seconds)."""
        self.home.mkdir(parents=True, exist_ok=True)
        begin = time.monotonic()
        result = self._airflow("db", "migrate", timeout=timeout)
        self.timings["migrate_s"] = time.monotonic() - begin
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise EmbeddedAirflowError(
                f"airflow db migrate failed (exit {result.returncode}):\n{output}")
        if ett_store:
            self.upgrade_ett_store(timeout)

    def upgrade_ett_store(self, timeout: float = 300.0) -> None:
        """`airflow-ett db upgrade`: the ETT store is a database of its own ([ett]
        store_url, SQLite in the home by default), migrated with the same environment the
        components will read it with."""
        ett = self.ett("db", "upgrade", timeout=timeout)
        if ett.returncode != 0:
            output = "\n".join((ett.stdout + ett.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise EmbeddedAirflowError(
                f"airflow-ett db upgrade failed (exit {ett.returncode}):\n{output}")

    def ett(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run the `airflow-ett` CLI with the components' environment (their [ett] config);
        past `timeout` its process tree is ended and subprocess.TimeoutExpired raised."""
        return run_tree([str(venv_script("airflow-ett")), *args], env=self.env,
                        timeout=timeout)

    def start(self, components: Sequence[str] | Mapping[str, Sequence[str]]
              = DEFAULT_COMPONENTS,
              env_of: Mapping[str, Mapping[str, str]] | None = None) -> None:
        """Start each component as its own process group, logging to logs/embedded/<name>.log;
        what runs tasks (`runs_tasks`) once the api-server being started answers.

        `components` names Airflow's own (`dag-processor`, `scheduler`, `triggerer`,
        `api-server`), or maps a name of one's choosing to the `airflow` CLI arguments it
        runs (a Celery worker: `{"worker-gpu": ("celery", "worker", "--queues", "gpu")}`);
        `env_of` adds to one component's environment (its own log-server port).

        Call it from a thread that lives as long as the components (the main thread): on
        Linux they get SIGTERM when the thread that started them ends, so that a parent
        killed with SIGKILL leaves nothing running.
        """
        commands = _commands(components)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        exe = str(airflow_executable())
        if self._started_utc is None:
            self._started_utc = datetime.now(UTC)
        self._start_called = time.monotonic()
        run_tasks = {name: args for name, args in commands.items() if runs_tasks(name)}
        first = {name: args for name, args in commands.items() if name not in run_tasks}
        self._components.start(first, exe=exe, env=self.env, cwd=self.home, env_of=env_of)
        if run_tasks and "api-server" in first:
            self._wait_for_execution_api(EXECUTION_API_WAIT_S)
        self._components.start(run_tasks, exe=exe, env=self.env, cwd=self.home,
                               env_of=env_of)

    def _wait_for_execution_api(self, timeout: float) -> None:
        """Until the api-server's execution API answers (a task's first call is to it)."""
        deadline = time.monotonic() + timeout
        while not self._rest.execution_api_answers():
            self.check_alive()
            if time.monotonic() > deadline:
                raise EmbeddedAirflowError(
                    f"the api-server's execution API did not answer within {timeout:.0f} s\n"
                    f"{self.log_tail('api-server', 15)}")
            time.sleep(0.25)

    def kill(self, component: str) -> list[int]:
        """SIGKILL a started component's whole process tree (a lost host: a Celery worker
        with the tasks it runs); returns the pids killed. `start` brings it back."""
        return self._components.kill(component)

    @property
    def pids(self) -> dict[str, int]:
        """The pid of each started component (also its process-group id)."""
        return self._components.pids

    def process_tree(self) -> dict[int, float]:
        """Every live process we started and its descendants: pid -> start time (epoch s)."""
        return self._components.process_tree()

    def check_alive(self) -> None:
        """Raise ComponentDied, with the log tail, if a started component has exited."""
        self._components.check_alive()

    def log_tail(self, component: str, lines: int = LOG_TAIL_LINES) -> str:
        return self._components.log_tail(component, lines)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every group and descendant we started; SIGKILL what is left after `timeout`.

        Idempotent. Returns once none of them runs (see `Components.stop`).
        """
        if self._components.stop(timeout):
            self._rest.forget_token()

    # --- REST API ------------------------------------------------------------------------

    def api(self, method: str, path: str, body: Any = None,
            expect: Iterable[int] = (200,)) -> Any:
        """Call the REST API as `admin` (`path` like `/api/v2/dags`); other statuses raise."""
        return self._rest.call(method, path, body, expect)

    def health(self) -> dict[str, Any] | None:
        """GET /api/v2/monitor/health (no login needed), or None while nothing answers."""
        return self._rest.health()

    # --- waiting -------------------------------------------------------------------------

    def wait_until_ready(self, timeout: float = 120.0) -> None:
        """Until the api-server answers, a login works and every started job heartbeats."""
        if "api-server" not in self._components:
            raise EmbeddedAirflowError("wait_until_ready needs the api-server component")
        deadline = time.monotonic() + timeout
        waiting: list[str] = ["api-server"]
        while time.monotonic() < deadline:
            self.check_alive()
            health = self.health()
            if health is None:
                waiting = ["api-server"]
            else:
                waiting = unhealthy(health, self._components, self._started_utc)
                self._note_ready(["api-server", *self._components], waiting)
                if not waiting and admin_password(self.home) is not None:
                    self._rest.login()
                    if self._start_called is not None:
                        self.timings["ready_s"] = time.monotonic() - self._start_called
                    return
                if not waiting:
                    waiting = ["admin password file"]
            time.sleep(0.5)
        details = "\n\n".join(f"--- {name} ---\n{self.log_tail(name, 15)}"
                              for name in self._components)
        raise EmbeddedAirflowError(
            f"Airflow not ready after {timeout:.0f} s; still waiting for {waiting}\n{details}")

    def _note_ready(self, names: Iterable[str], waiting: Sequence[str]) -> None:
        """Timings: `<component>_ready_s`, seconds from start() to its first healthy poll."""
        if self._start_called is None:
            return
        for name in names:
            key = f"{name}_ready_s"
            if name in self._components and name not in waiting and key not in self.timings:
                self.timings[key] = time.monotonic() - self._start_called

    def import_errors(self) -> list[dict[str, Any]]:
        """Import errors the dag-processor recorded: filename and stack_trace."""
        body = self.api("GET", "/api/v2/importErrors?limit=100")
        errors = body.get("import_errors", []) if isinstance(body, dict) else []
        return [e for e in errors if isinstance(e, dict)]

    def wait_for_dag(self, dag_id: str, timeout: float = 60.0) -> dict[str, Any]:
        """Until `dag_id` is parsed and serialized; returns the DAG as the REST API shows it.

        Fails early, with the error text, when a file that mentions `dag_id` failed to
        import; on timeout the message lists every import error there is.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            body = self.api("GET", f"/api/v2/dags/{_quote(dag_id)}/details", expect=(200, 404))
            if isinstance(body, dict) and body.get("dag_id") == dag_id:
                return body
            errors = self.import_errors()
            relevant = [e for e in errors if self._mentions(e.get("filename"), dag_id)]
            if relevant or time.monotonic() >= deadline:
                shown = relevant or errors
                text = "\n\n".join(f"{e.get('filename')}:\n{e.get('stack_trace', '').rstrip()}"
                                   for e in shown)
                if shown:
                    raise DagImportError(f"DAG {dag_id!r} is not loaded; import errors:\n{text}")
                raise DagImportError(
                    f"DAG {dag_id!r} did not appear within {timeout:.0f} s and no file failed "
                    f"to import: is it defined in {self.dags_folder}, in a file that holds the "
                    "words 'airflow' and 'DAG' (else it is not parsed at all)? "
                    f"dag-processor log:\n"
                    f"{self.log_tail('dag-processor', 15)}")
            time.sleep(0.5)

    def _mentions(self, filename: Any, dag_id: str) -> bool:
        if not isinstance(filename, str):
            return False
        path = Path(filename)
        if not path.is_absolute():
            path = self.dags_folder / path
        try:
            return dag_id in path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return False

    def wait_until(self, what: str, check: Callable[[], Any], timeout: float = 300.0,
                   poll: float = 1.0) -> Any:
        """Until `check()` returns something true, which is returned; the components are
        checked alive meanwhile. On timeout, `what` and the scheduler's log tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = check()
            if got:
                return got
            self.check_alive()
            time.sleep(poll)
        raise EmbeddedAirflowError(f"{what}: not within {timeout:.0f} s\n"
                                   f"{self.log_tail('scheduler')}")

    # --- runs ----------------------------------------------------------------------------

    def unpause(self, dag_id: str) -> None:
        self.api("PATCH", f"/api/v2/dags/{_quote(dag_id)}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        """Create a manual run now; returns its run_id."""
        body = self.api("POST", f"/api/v2/dags/{_quote(dag_id)}/dagRuns",
                        # logical_date is required in Airflow 3 (null: a run not tied to one).
                        {"logical_date": None, "conf": dict(conf or {})})
        return str(body["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        body = self.api("GET", f"/api/v2/dags/{_quote(dag_id)}/dagRuns/{_quote(run_id)}")
        return str(body.get("state"))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The run's task instances: task_id, map_index, try_number, state, dates, duration,
        queue, hostname."""
        body = self.api("GET", f"/api/v2/dags/{_quote(dag_id)}/dagRuns/{_quote(run_id)}"
                        "/taskInstances?limit=100")
        keys = ("task_id", "map_index", "try_number", "state", "start_date", "end_date",
                "duration", "queue", "hostname")
        rows = [{k: ti.get(k) for k in keys} for ti in body.get("task_instances", [])]
        return sorted(rows, key=lambda r: (r["start_date"] or "~", r["task_id"]))

    def task_log_path(self, dag_id: str, run_id: str, task_id: str, try_number: int,
                      map_index: int = -1) -> Path:
        """Where the task's log file is, by Airflow's default `log_filename_template`."""
        mapped = f"map_index={map_index}/" if map_index >= 0 else ""
        return (self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
                / f"task_id={task_id}" / f"{mapped}attempt={try_number}.log")

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300.0,
                     poll: float = 1.0) -> str:
        """Until the run is success or failed; returns that state.

        On timeout, raises RunTimeout with each task's state and the scheduler log tail.
        """
        deadline = time.monotonic() + timeout
        while True:
            state = self.run_state(dag_id, run_id)
            if state in TERMINAL_RUN_STATES:
                return state
            self.check_alive()
            if time.monotonic() >= deadline:
                tasks = "\n".join(f"  {t['task_id']}: {t['state']} (try {t['try_number']})"
                                  for t in self.task_instances(dag_id, run_id))
                raise RunTimeout(
                    f"run {run_id} of {dag_id} still {state} after {timeout:.0f} s; tasks:\n"
                    f"{tasks or '  (none)'}\nscheduler log:\n{self.log_tail('scheduler')}")
            time.sleep(poll)
