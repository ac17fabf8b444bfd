"""A real Airflow (SQLite + LocalExecutor) run as separate processes, for demos and tests.

`airflow standalone` is not used: on stop it left its children running. Instead each
component (`dag-processor`, `scheduler`, `triggerer`, `api-server`) is its own `airflow`
CLI process in its own session and process group, with its own log file, and `stop()`
ends every process it started, and every descendant it has seen, by pid.

Nothing here imports Airflow: this module runs in the caller's process (a test, the
`airflow-ett` CLI), where importing Airflow would cost seconds and freeze its
configuration before `AIRFLOW_HOME` is chosen. Triggering and polling go through the
REST API (one HTTP call is milliseconds; each `airflow` CLI call pays ~3-5 s of imports).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from airflow_ett._proc import ProcessTree
from airflow_ett._proc import run as run_tree

DEFAULT_COMPONENTS: tuple[str, ...] = ("dag-processor", "scheduler", "triggerer", "api-server")
KNOWN_COMPONENTS = frozenset(DEFAULT_COMPONENTS)
TERMINAL_RUN_STATES = frozenset({"success", "failed"})
ADMIN_USER = "admin"
PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"
SECRETS_FILE = "embedded_secrets.json"
LOG_TAIL_LINES = 40

# Which health entry (GET /api/v2/monitor/health) proves each component is up.
_HEALTH_KEYS = {
    "scheduler": "scheduler",
    "triggerer": "triggerer",
    "dag-processor": "dag_processor",
}
_HEARTBEAT_KEYS = {
    "scheduler": "latest_scheduler_heartbeat",
    "triggerer": "latest_triggerer_heartbeat",
    "dag_processor": "latest_dag_processor_heartbeat",
}


class EmbeddedAirflowError(RuntimeError):
    """The embedded Airflow could not do what was asked; the message says why and where."""


class ComponentDied(EmbeddedAirflowError):
    """A component process exited while it was still needed; the message holds its log tail."""


class DagImportError(EmbeddedAirflowError):
    """The DAG never appeared, or its file failed to import (the message holds the error)."""


class RunTimeout(EmbeddedAirflowError):
    """A DAG run was not finished in time; the message holds task states and the scheduler log."""


def venv_script(name: str) -> Path:
    """A console script (`airflow`, `airflow-ett`) of the interpreter running us.

    Not `shutil.which`: PATH may hold another Airflow (a system one, another venv), and the
    components must run the same Airflow, and see the same plugins, as this interpreter.
    `sys.executable` is not resolved: a venv's python is a symlink to the base interpreter,
    whose bin/ has neither script.
    """
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise EmbeddedAirflowError(f"no {name} executable next to {sys.executable}")
    return path


def airflow_executable() -> Path:
    return venv_script("airflow")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel's pick; a small race is accepted)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _load_or_create_secrets(home: Path) -> dict[str, str]:
    """Secrets shared by every component, kept in `home` so that a restart agrees with them.

    The JWT secret signs the tokens the scheduler gives task runners for the Execution
    API: if the scheduler and the api-server disagree, every task fails to start. Left to
    Airflow, each process without a value in airflow.cfg would draw its own.
    """
    path = home / SECRETS_FILE
    stored: dict[str, str] = {}
    if path.is_file():
        with contextlib.suppress(ValueError, OSError):
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                stored = {str(k): str(v) for k, v in loaded.items()}
    wanted = {
        # 64 bytes at least: the tokens are HS512, and PyJWT warns below that.
        "jwt_secret": lambda: base64.b64encode(secrets.token_bytes(64)).decode("ascii"),
        "api_secret_key": lambda: base64.b64encode(secrets.token_bytes(16)).decode("ascii"),
    }
    missing = [key for key in wanted if not stored.get(key)]
    if missing:
        for key in missing:
            stored[key] = wanted[key]()
        home.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(stored, fh)
        tmp.replace(path)
    return stored


def admin_password(home: Path) -> str | None:
    """The SimpleAuthManager's generated password for `admin`, or None before it exists.

    The api-server writes the file on its first start; a later start reuses it.
    """
    path = home / PASSWORD_FILE
    try:
        passwords = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = passwords.get(ADMIN_USER) if isinstance(passwords, dict) else None
    return str(value) if value else None


def login_info(home: Path, url: str) -> str:
    """Where to log in to the UI, as lines a person can read in a terminal."""
    password = admin_password(home)
    return "\n".join([
        f"Airflow UI: {url}",
        f"  user:     {ADMIN_USER}",
        f"  password: {password if password else '(not generated yet: start the api-server)'}"
        f"  (from {home / PASSWORD_FILE})",
    ])


# --- process bookkeeping (airflow_ett._proc: a psutil walk, remembered across walks) ------


def _set_parent_death_signal() -> None:
    """In the child, before exec: get SIGTERM if the parent dies (Linux only).

    A test runner killed with SIGKILL cannot run stop(); without this its scheduler and
    api-server would keep running, and keep the two cores busy, for ever.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)


@dataclass(slots=True)
class _Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_offset: int
    log_file: IO[bytes]
    started_at: float = field(default_factory=time.monotonic)


def _tail(path: Path, lines: int = LOG_TAIL_LINES, offset: int = 0) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror or exc})"
    kept = text.splitlines()[-lines:]
    return "\n".join(kept) if kept else "(empty)"


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


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
        self.env = self._compute_env(extra_env or {})
        self.timings: dict[str, float] = {}
        self._components: dict[str, _Component] = {}
        self._tree = ProcessTree()  # every component and descendant ever seen
        self._started_utc: datetime | None = None
        self._start_called: float | None = None
        self._token: str | None = None

    # --- configuration -------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def _compute_env(self, extra_env: Mapping[str, str]) -> dict[str, str]:
        """The environment of every child: Airflow reads its whole configuration from it.

        Environment variables beat airflow.cfg, so an airflow.cfg left in `home` (Airflow
        writes one on first start) cannot change what matters here; `extra_env` beats
        everything, e.g. a PostgreSQL URL or `AIRFLOW__ETT__*` settings.
        """
        stored = _load_or_create_secrets(self.home)
        env = dict(os.environ)
        env.update({
            "AIRFLOW_HOME": str(self.home),
            # A developer's AIRFLOW_CONFIG would otherwise be read instead of home's.
            "AIRFLOW_CONFIG": str(self.home / "airflow.cfg"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            # LocalExecutor forks `parallelism` workers up front; the machine has 2 cores.
            "AIRFLOW__CORE__PARALLELISM": str(self.parallelism),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.home / 'airflow.db'}",
            # Loopback only: the SimpleAuthManager is for development.
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__WORKERS": "1",
            # Task runners talk to the Execution API served by the api-server; the default
            # is http://localhost:8080/execution/, wrong for any other port.
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": stored["jwt_secret"],
            "AIRFLOW__API__SECRET_KEY": stored["api_secret_key"],
            # Look for new DAG files every 2 s instead of every 300 s. Changed files are
            # re-parsed at once anyway (file_parsing_sort_mode=modified_time).
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__DAG_PROCESSOR__BUNDLE_REFRESH_CHECK_INTERVAL": "1",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__PRINT_STATS_INTERVAL": "0",
            # An edited DAG is re-serialized (so the next run uses it) at most this often:
            # 30 s by default, longer than an edit-and-trigger loop in the UI.
            "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL": "5",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            # The scheduler (LocalExecutor) and triggerer serve logs on fixed ports by
            # default (8793, 8794): two installations, or a Celery worker, would clash.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__COLORED_CONSOLE_LOG": "False",
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        })
        env.update(extra_env)
        return env

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

    def migrate(self, timeout: float = 300.0) -> None:
        """`airflow db migrate`: creates or upgrades the SQLite metadata DB (a few seconds)."""
        self.home.mkdir(parents=True, exist_ok=True)
        begin = time.monotonic()
        result = self._airflow("db", "migrate", timeout=timeout)
        self.timings["migrate_s"] = time.monotonic() - begin
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-LOG_TAIL_LINES:])
            raise EmbeddedAirflowError(
                f"airflow db migrate failed (exit {result.returncode}):\n{output}")
        # The ETT store is a database of its own ([ett] store_url, SQLite in the home by
        # default): migrated with the same environment the components will read it with.
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

    def start(self, components: Sequence[str] = DEFAULT_COMPONENTS) -> None:
        """Start each component as its own process group, logging to logs/embedded/<name>.log.

        Call it from a thread that lives as long as the components (the main thread): on
        Linux they get SIGTERM when the thread that started them ends, so that a parent
        killed with SIGKILL leaves nothing running.
        """
        unknown = [c for c in components if c not in KNOWN_COMPONENTS]
        if unknown:
            raise ValueError(f"unknown components {unknown}; known: {sorted(KNOWN_COMPONENTS)}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        exe = str(airflow_executable())
        if self._started_utc is None:
            self._started_utc = datetime.now(UTC)
        self._start_called = time.monotonic()
        for name in components:
            if name in self._components and self._components[name].process.poll() is None:
                continue
            log_path = self.log_dir / f"{name}.log"
            log_file = log_path.open("ab")
            offset = log_file.tell()
            log_file.write(f"=== {datetime.now(UTC).isoformat()} airflow {name} ===\n".encode())
            log_file.flush()
            process = subprocess.Popen(
                [exe, name], env=self.env, cwd=self.home, stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT,
                # Own session and group: Ctrl-C in our terminal does not reach it (stop()
                # orders the shutdown), and the group can be signalled as a whole.
                start_new_session=True, preexec_fn=_set_parent_death_signal,
            )
            self._components[name] = _Component(name, process, log_path, offset, log_file)
            self._tree.add_root(process, group=True)

    @property
    def pids(self) -> dict[str, int]:
        """The pid of each started component (also its process-group id)."""
        return {name: c.process.pid for name, c in self._components.items()}

    def process_tree(self) -> dict[int, float]:
        """Every live process we started and its descendants: pid -> start time (epoch s).

        Task runners get their own process group from Airflow's supervisor, so a group
        signal alone does not reach them: the tree is walked, and the groups too (a
        member whose parent died has left the tree but not its group).
        """
        live = self._tree.refresh()
        seen = self._tree.pids
        return {p.pid: seen[p.pid] for p in live if p.pid in seen}

    def check_alive(self) -> None:
        """Raise ComponentDied, with the log tail, if a started component has exited."""
        for comp in self._components.values():
            code = comp.process.poll()
            if code is not None:
                raise ComponentDied(
                    f"airflow {comp.name} exited with status {code}; last lines of "
                    f"{comp.log_path}:\n{_tail(comp.log_path, offset=comp.log_offset)}")

    def log_tail(self, component: str, lines: int = LOG_TAIL_LINES) -> str:
        comp = self._components.get(component)
        if comp is None:
            return f"({component} was not started)"
        return _tail(comp.log_path, lines, comp.log_offset)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM every group and descendant we started; SIGKILL what is left after `timeout`.

        Idempotent. Returns once none of them runs: the tree is re-walked while waiting,
        so a process whose parent exits first (and so leaves the tree) is still waited for.
        """
        if not self._components:
            return
        ended = self._tree.terminate(grace_s=timeout)
        if ended.left:
            print(f"[embedded] still running after SIGKILL: {list(ended.left)}",
                  file=sys.stderr)
        for comp in self._components.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                comp.process.wait(timeout=1.0)
            comp.log_file.close()
        self._components.clear()
        self._tree = ProcessTree()
        self._token = None

    # --- REST API ------------------------------------------------------------------------

    def _http(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.api_url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", errors="replace")

    def _login(self) -> str:
        password = admin_password(self.home)
        if password is None:
            raise EmbeddedAirflowError(f"no admin password in {self.home / PASSWORD_FILE} yet "
                                       "(has the api-server started?)")
        status, body = self._http("POST", "/auth/token",
                                  {"username": ADMIN_USER, "password": password})
        if status not in (200, 201) or not isinstance(body, dict) or "access_token" not in body:
            raise EmbeddedAirflowError(f"POST /auth/token answered {status}: {body}")
        return str(body["access_token"])

    def api(self, method: str, path: str, body: Any = None,
            expect: Iterable[int] = (200,)) -> Any:
        """Call the REST API as `admin` (`path` like `/api/v2/dags`); other statuses raise."""
        if self._token is None:
            self._token = self._login()
        status, answer = self._http(method, path, body, token=self._token)
        if status == 401:  # expired, or the api-server restarted with a new key
            self._token = self._login()
            status, answer = self._http(method, path, body, token=self._token)
        if status not in set(expect):
            raise EmbeddedAirflowError(f"{method} {path} answered {status}: {answer}")
        return answer

    # --- waiting -------------------------------------------------------------------------

    def health(self) -> dict[str, Any] | None:
        """GET /api/v2/monitor/health (no login needed), or None while nothing answers."""
        try:
            status, body = self._http("GET", "/api/v2/monitor/health", timeout=5.0)
        except (OSError, urllib.error.URLError):
            return None
        return body if status == 200 and isinstance(body, dict) else None

    def _unhealthy(self, health: Mapping[str, Any]) -> list[str]:
        """Started components whose health entry is not fresh from this start."""
        waiting = []
        if health.get("metadatabase", {}).get("status") != "healthy":
            waiting.append("metadatabase")
        for name, key in _HEALTH_KEYS.items():
            if name not in self._components:
                continue
            entry = health.get(key) or {}
            beat = _parse_time(entry.get(_HEARTBEAT_KEYS[key]))
            # A job row from an earlier start can still look healthy for a while.
            fresh = beat is not None and (self._started_utc is None or beat >= self._started_utc)
            if entry.get("status") != "healthy" or not fresh:
                waiting.append(name)
        return waiting

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
                waiting = self._unhealthy(health)
                self._note_ready(["api-server", *self._components], waiting)
                if not waiting and admin_password(self.home) is not None:
                    self._token = self._login()
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
        quoted = urllib.parse.quote(dag_id, safe="")
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            body = self.api("GET", f"/api/v2/dags/{quoted}/details", expect=(200, 404))
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

    # --- runs ----------------------------------------------------------------------------

    def unpause(self, dag_id: str) -> None:
        quoted = urllib.parse.quote(dag_id, safe="")
        self.api("PATCH", f"/api/v2/dags/{quoted}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        """Create a manual run now; returns its run_id."""
        quoted = urllib.parse.quote(dag_id, safe="")
        body = self.api("POST", f"/api/v2/dags/{quoted}/dagRuns",
                        # logical_date is required in Airflow 3 (null: a run not tied to one).
                        {"logical_date": None, "conf": dict(conf or {})})
        return str(body["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        body = self.api("GET", f"/api/v2/dags/{urllib.parse.quote(dag_id, safe='')}/dagRuns/"
                        f"{urllib.parse.quote(run_id, safe='')}")
        return str(body.get("state"))

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The run's task instances: task_id, map_index, try_number, state, dates, duration."""
        body = self.api("GET", f"/api/v2/dags/{urllib.parse.quote(dag_id, safe='')}/dagRuns/"
                        f"{urllib.parse.quote(run_id, safe='')}/taskInstances?limit=100")
        keys = ("task_id", "map_index", "try_number", "state", "start_date", "end_date",
                "duration")
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


# --- one-shot use: the `airflow-ett embedded` commands -------------------------------------


@dataclass(frozen=True, slots=True)
class RunResult:
    """A finished run; (dag_id, run_id) is how its ETT report is looked up."""

    dag_id: str
    run_id: str
    state: str
    task_instances: list[dict[str, Any]]
    trigger_to_end_s: float
    timings: dict[str, float]

    @property
    def succeeded(self) -> bool:
        return self.state == "success"


def run_dag(
    airflow: EmbeddedAirflow,
    dag_id: str,
    *,
    conf: Mapping[str, Any] | None = None,
    timeout: float = 600.0,
    ready_timeout: float = 180.0,
    progress: Callable[[str], None] | None = None,
) -> RunResult:
    """Migrate, start, trigger `dag_id` and wait for its end; the components keep running.

    The caller owns `airflow` (a context manager) and decides when to stop it, so it can
    look at the run, or keep the UI up, before everything goes away.
    """
    say = progress or (lambda _msg: None)
    say(f"migrating the metadata DB in {airflow.home}")
    airflow.migrate()
    say(f"starting {', '.join(DEFAULT_COMPONENTS)} (logs: {airflow.log_dir})")
    airflow.start()
    airflow.wait_until_ready(ready_timeout)
    say(f"ready after {airflow.timings.get('ready_s', 0.0):.1f} s; waiting for DAG {dag_id!r}")
    airflow.wait_for_dag(dag_id, timeout=min(timeout, 120.0))
    airflow.unpause(dag_id)
    begin = time.monotonic()
    run_id = airflow.trigger(dag_id, conf)
    say(f"triggered {run_id}; waiting (timeout {timeout:.0f} s)")
    state = airflow.wait_for_run(dag_id, run_id, timeout=timeout)
    elapsed = time.monotonic() - begin
    return RunResult(dag_id=dag_id, run_id=run_id, state=state,
                     task_instances=airflow.task_instances(dag_id, run_id),
                     trigger_to_end_s=elapsed, timings=dict(airflow.timings))


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt meanwhile, so `with` blocks clean up."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def serve_until_interrupted(airflow: EmbeddedAirflow, poll: float = 1.0) -> None:
    """Block until Ctrl-C or SIGTERM (returns) or a component dies (ComponentDied)."""
    with terminate_as_interrupt(), contextlib.suppress(KeyboardInterrupt):
        while True:
            airflow.check_alive()
            time.sleep(poll)
