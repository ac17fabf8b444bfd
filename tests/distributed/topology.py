"""The distributed deployment as tests see it: the ONE reader of docker/compose.yaml.

The compose file (and docker/airflow.env, which it passes to every Airflow service) is the
single source of the deployment's components, queues and settings. The distributed test
(tests/distributed) starts the same Airflow components as processes on this machine with
the same settings, and tests/docker/test_compose.py checks the file against the operators
and against a real compose implementation; both read it through here, so a component,
queue or setting cannot differ between the deployment and what CI runs.

Read with `yaml.safe_load`, which resolves the file's anchors and `<<` merges as compose
does. `${VAR...}` interpolation is compose's and is left as written: the values here are
the file's own text (hosts and secrets are interpolated only where compose runs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final

import yaml

REPO: Final = Path(__file__).resolve().parents[2]
COMPOSE_PATH: Final = REPO / "docker" / "compose.yaml"
AIRFLOW_ENV_PATH: Final = REPO / "docker" / "airflow.env"
DEFAULT_COMPOSE: Final = COMPOSE_PATH

# Services of the compose file that the local distributed test does not start as processes,
# by their Airflow command: Flower is a monitoring UI over the broker; no test outcome
# depends on it, and it would be one more port and process on a 2-core machine.
_NOT_STARTED_LOCALLY: Final = {("celery", "flower")}

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TopologyError(ValueError):
    """The compose file or airflow.env cannot be read as a deployment; the message names
    the file, the field and the value."""


@dataclass(frozen=True, slots=True)
class Service:
    """One compose service.

    `airflow_args`: the command after `airflow` when the service runs one Airflow CLI
    command (("scheduler",), ("celery", "worker", "--queues", "gpu", ...)); None otherwise
    (postgres, redis, the shell one-shot airflow-init, the preemption controller).
    `environment`: the service's own `environment:` entries as written (hosts and secrets,
    uninterpolated); the shared settings are `Topology.settings`.
    `image_uses_gpu`: the service asks the engine for an NVIDIA device.
    """

    name: str
    airflow_args: tuple[str, ...] | None
    environment: Mapping[str, str]
    image_uses_gpu: bool


@dataclass(frozen=True, slots=True)
class Worker:
    """A Celery worker service: the queues it consumes and its `--concurrency` (None: the
    command does not set it, so `[celery] worker_concurrency` applies)."""

    service: str
    queues: tuple[str, ...]
    concurrency: int | None


@dataclass(frozen=True, slots=True)
class Topology:
    """`settings`: airflow.env's keys and values (what every Airflow service gets)."""

    services: Mapping[str, Service]
    workers: tuple[Worker, ...]
    settings: Mapping[str, str]


def _fail(where: str, field: str, value: object, why: str) -> TopologyError:
    return TopologyError(f"{where}: {field} = {value!r}: {why}")


def parse_env_file(path: Path) -> dict[str, str]:
    """airflow.env's KEY=VALUE lines, in the subset every compose implementation and
    python-dotenv read alike: no quotes, no inline comments, no `export`, no spaces around
    `=`. Anything else is refused by line, so no reader can see a different value."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        key, sep, value = raw.partition("=")
        if not sep:
            raise _fail(where, "line", raw, "expected KEY=VALUE")
        if not _ENV_KEY.fullmatch(key):
            raise _fail(where, "key", key, "must be a bare variable name (letters, digits, _; "
                                           "no `export`, no spaces around '=')")
        if value != value.strip():
            raise _fail(where, key, value, "leading or trailing whitespace")
        if value[:1] in ("'", '"'):
            raise _fail(where, key, value, "write the value without quotes: compose "
                                           "implementations disagree on them")
        if " #" in value:
            raise _fail(where, key, value, "no inline comments: compose implementations "
                                           "disagree on them; put the comment on its own line")
        if key in out:
            raise _fail(where, key, value, f"set twice (first: {out[key]!r})")
        out[key] = value
    return out


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TopologyError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise TopologyError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(loaded, dict):
        raise _fail(str(path), "document", type(loaded).__name__, "must be a mapping")
    return loaded


def _str_list(where: str, field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(where, field, value, "must be a YAML list of strings")
    return tuple(value)


def _environment(where: str, value: object) -> dict[str, str]:
    """Compose's two spellings: a mapping, or a list of KEY=VALUE."""
    if value is None:
        return {}
    items: list[tuple[object, object]]
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, list):
        items = []
        for entry in value:
            if not isinstance(entry, str) or "=" not in entry:
                raise _fail(where, "environment entry", entry, "must be KEY=VALUE")
            name, _, text = entry.partition("=")
            items.append((name, text))
    else:
        raise _fail(where, "environment", value, "must be a mapping or a list of KEY=VALUE")
    out: dict[str, str] = {}
    for key, item in items:
        if not isinstance(key, str) or not _ENV_KEY.fullmatch(key):
            raise _fail(where, "environment key", key, "must be a variable name")
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise _fail(where, f"environment[{key}]", item,
                        "must be a string (quote true/false and empty values)")
        out[key] = str(item)
    return out


def _uses_gpu(where: str, service: Mapping[str, Any]) -> bool:
    deploy = service.get("deploy") or {}
    if not isinstance(deploy, dict):
        raise _fail(where, "deploy", deploy, "must be a mapping")
    devices = ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []
    if not isinstance(devices, list):
        raise _fail(where, "deploy.resources.reservations.devices", devices, "must be a list")
    for i, device in enumerate(devices):
        if not isinstance(device, dict):
            raise _fail(where, f"deploy.resources.reservations.devices[{i}]", device,
                        "must be a mapping")
        if device.get("driver") == "nvidia" or "gpu" in (device.get("capabilities") or []):
            return True
    return False


def _service(name: str, raw: object) -> Service:
    where = f"service {name!r}"
    if not isinstance(raw, dict):
        raise _fail(where, "definition", raw, "must be a mapping")
    command = raw.get("command")
    args: tuple[str, ...] | None = None
    if command is not None:
        words = _str_list(where, "command", command)
        if words and words[0] == "airflow":
            args = words[1:]
    return Service(name=name, airflow_args=args,
                   environment=MappingProxyType(_environment(where, raw.get("environment"))),
                   image_uses_gpu=_uses_gpu(where, raw))


def _option(args: tuple[str, ...], long: str, short: str) -> str | None:
    """The value of `--long V`, `--long=V` or `-s V` in a CLI argument list."""
    for i, arg in enumerate(args):
        if arg in (long, short):
            return args[i + 1] if i + 1 < len(args) else ""
        if arg.startswith(long + "="):
            return arg.split("=", 1)[1]
    return None


def _worker(service: Service) -> Worker | None:
    args = service.airflow_args
    if args is None or args[:2] != ("celery", "worker"):
        return None
    where = f"service {service.name!r}"
    queues = _option(args, "--queues", "-q")
    names = tuple(q.strip() for q in (queues or "").split(","))
    if not queues or not all(names):
        raise _fail(where, "command --queues", queues,
                    "a worker must name its queues (comma-separated, none empty)")
    raw = _option(args, "--concurrency", "-c")
    concurrency: int | None = None
    if raw is not None:
        try:
            concurrency = int(raw)
        except ValueError:
            raise _fail(where, "command --concurrency", raw, "must be an integer") from None
        if concurrency < 1:
            raise _fail(where, "command --concurrency", raw, "must be >= 1")
    return Worker(service=service.name, queues=names, concurrency=concurrency)


def _env_file(compose: Path, services: Mapping[str, Any]) -> Path:
    """The one env_file every service that has one names (relative to the compose file)."""
    named: dict[str, set[Path]] = {}
    for name, raw in services.items():
        if not isinstance(raw, dict) or "env_file" not in raw:
            continue
        value = raw["env_file"]
        files = (value,) if isinstance(value, str) else _str_list(
            f"service {name!r}", "env_file", value)
        for f in files:
            named.setdefault(name, set()).add((compose.parent / f).resolve())
    every = {p for paths in named.values() for p in paths}
    if len(every) != 1:
        shown = {n: sorted(map(str, p)) for n, p in named.items()}
        raise _fail(str(compose), "env_file", shown,
                    "the Airflow services must share exactly one settings file")
    return every.pop()


def load_topology(compose: Path = DEFAULT_COMPOSE) -> Topology:
    doc = _load_yaml(compose)
    raw_services = doc.get("services")
    if not isinstance(raw_services, dict) or not raw_services:
        raise _fail(str(compose), "services", raw_services, "must be a non-empty mapping")
    services = {str(name): _service(str(name), raw) for name, raw in raw_services.items()}
    workers = tuple(w for s in services.values() if (w := _worker(s)) is not None)
    settings = parse_env_file(_env_file(compose, raw_services))
    return Topology(services=MappingProxyType(services), workers=workers,
                    settings=MappingProxyType(settings))


def airflow_components(topology: Topology) -> dict[str, tuple[str, ...]]:
    """Service name -> `airflow` CLI arguments, for each component the local distributed
    test starts as a process: every service running one Airflow command, except those in
    `_NOT_STARTED_LOCALLY`. Not included either: postgres and redis (already running on the
    machine), airflow-init (a shell one-shot; the test migrates its own databases), the
    preemption controller (not an Airflow command)."""
    return {
        name: service.airflow_args
        for name, service in topology.services.items()
        if service.airflow_args is not None
        and service.airflow_args[:2] not in _NOT_STARTED_LOCALLY
    }


def path_settings(topology: Topology) -> dict[str, str]:
    """The settings whose values are absolute paths inside the image (/opt/airflow/...):
    a test running on the host must point each at a directory of its own."""
    return {k: v for k, v in topology.settings.items() if v.startswith("/")}
