"""The tenants file: each tenant's priority, GPU quota and preemption terms, and the fleet's
scheduling knobs (docs/decisions/0013-tenants-file.md).

The file is TOML (read with the standard library's `tomllib`, like the components file),
one `[tenants.<name>]` table per tenant and an optional `[scheduling]` table. It is checked
whole on load: an error names the file, the tenant, the field and the value, so a typo
never turns into a tenant silently running on defaults.

Who reads it, and how often: the cluster policies look a tenant up for every task of every
DAG they parse, and the preemption controller on every pass. `TenantsCache.current` serves
them: a `stat` per call, a re-read only when the file changed, and the last good version
kept in force when an edit breaks the file (its error recorded, for the log and the fleet
page). A broken edit must never take the scheduler or the DAG processor down, nor drop
every tenant to no policy at all.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from airflow_ett._untrusted import (
    UntrustedFileError,
    decode_text,
    parse_toml,
    read_bytes,
)
from airflow_ett.scheduling import limits
from airflow_ett.scheduling.limits import Range
from airflow_ett.scheduling.model import DEFAULT_WAIT_PRICE, TenantPolicy, pool_name

_log = logging.getLogger(__name__)

#: A tenant name is part of its pool's name (`ett_tenant_<name>`), which Airflow stores,
#: shows in URLs and reports in metrics: letters, digits, `_` and `-` only.
TENANT_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,50}")

_TOP_LEVEL: Final = ("tenants", "scheduling")
_TENANT_FIELDS: Final = ("priority", "quota_gpus", "borrow_limit_gpus", "preemptible",
                         "min_run_s", "grace_s", "max_preemptions_per_day", "max_tts_s")
_REQUIRED: Final = {
    "priority": "a whole number; the higher goes first",
    "quota_gpus": "a whole number >= 0: the GPUs the tenant is guaranteed",
}
_SCHEDULING_FIELDS: Final = ("aging_per_hour", "default_queue", "cpu_queue", "capacity_gpus",
                              "preemption", "resume_after_s", "checkpoint_wait_price")
#: Fields of earlier versions of the file, and what replaced them.
_REPLACED: Final = {
    "checkpoint_wait_s": "checkpoint_wait_price, a price on the waiting job's wait instead "
                         "of a bound (docs/decisions/0015-preemption.md): remove it, or set "
                         f"checkpoint_wait_price (default {DEFAULT_WAIT_PRICE:g})",
}
#: A tenants file is a few KB even for hundreds of tenants; anything past this is not one
#: (and a scheduler process must not hold it).
MAX_FILE_BYTES: Final = 1 << 20
_WHAT: Final = "tenants file"

DEFAULT_AGING_PER_HOUR: Final = 1.0
DEFAULT_QUEUE: Final = "gpu"
DEFAULT_CPU_QUEUE: Final = "cpu"


class TenantsError(ValueError):
    """A tenants file that cannot be used; the message names the file, tenant, field, value."""


class UnknownTenantError(TenantsError):
    """A tenant the file does not name (a DAG tagged with a typo, a tenant not added yet)."""


@dataclass(frozen=True, slots=True)
class TenantsConfig:
    """A valid tenants file: the policies by tenant name (in file order), the fleet-wide
    knobs, the file it came from and the SHA-256 of its bytes (which version is in force).

    `aging_per_hour` is the priority points a waiting task gains per hour waited (the
    priority strategy adds them, so a low-priority tenant's work does not starve);
    `default_queue` is the queue of GPU (train) tasks, `cpu_queue` that of the others.
    `capacity_gpus` is how many GPUs the GPU queue's workers have in all (None: the sum of
    the quotas), what the preemption controller counts free GPUs against; `preemption`
    turns the controller's preemptions on (off: it only logs what it would do);
    `resume_after_s` is how long a preempted job waits before it may run again (keep it
    above the scheduler's lag in handling executor events: Airflow counts the event of
    a rescheduled try that arrives after the task was queued again as a failed try, so a
    retry is spent; 5 s did that once on a loaded 2-core machine, the 30 s default
    leaves room);
    `checkpoint_wait_price` what a waiting job's wait for a victim's next periodic
    checkpoint costs (an `at_checkpoint` yield, which loses no work, is chosen when the
    work it saves is worth the wait: `FleetState.wait_price`); 0: a victim always waits
    for a known checkpoint, `MAX_WAIT_PRICE`: never.
    """

    tenants: dict[str, TenantPolicy]
    source: str
    digest: str
    aging_per_hour: float = DEFAULT_AGING_PER_HOUR
    default_queue: str = DEFAULT_QUEUE
    cpu_queue: str = DEFAULT_CPU_QUEUE
    capacity_gpus: int | None = None
    preemption: bool = False
    resume_after_s: float = 30.0
    checkpoint_wait_price: float = DEFAULT_WAIT_PRICE

    @property
    def fleet_gpus(self) -> int:
        """The GPUs preemption counts against: `capacity_gpus`, or the quotas' sum."""
        if self.capacity_gpus is not None:
            return self.capacity_gpus
        return sum(t.quota_gpus for t in self.tenants.values())

    def get(self, name: str) -> TenantPolicy:
        """The tenant's policy; `UnknownTenantError` naming the known tenants if none."""
        try:
            return self.tenants[name]
        except KeyError:
            raise UnknownTenantError(
                f"unknown tenant {name!r}: tenants file {self.source} names "
                f"{', '.join(repr(t) for t in self.tenants)}") from None

    @property
    def pools(self) -> dict[str, str]:
        """Each tenant's Airflow pool, by tenant name."""
        return {name: pool_name(name) for name in self.tenants}


# --- loading ----------------------------------------------------------------------------


def load_tenants(path: str | Path) -> TenantsConfig:
    """The tenants file at `path`, validated whole; `TenantsError` says what is wrong."""
    file = Path(path).expanduser()
    return parse_tenants(read_file(file), source=str(file))


def read_file(file: Path) -> bytes:
    """The file's bytes, read bounded (`_untrusted`: a regular file of at most
    `MAX_FILE_BYTES`); `TenantsError` when it is missing, not a regular file (a FIFO or
    `/dev/zero` would hang or exhaust the scheduler), too large or cannot be read."""
    try:
        return read_bytes(file, what=_WHAT, max_bytes=MAX_FILE_BYTES)
    except UntrustedFileError as exc:
        raise TenantsError(str(exc)) from None


def parse_tenants(data: bytes, *, source: str) -> TenantsConfig:
    """A tenants file's bytes (`source` names it in errors and in the config)."""
    try:
        raw = parse_toml(decode_text(data, what=_WHAT, path=source), what=_WHAT, path=source)
    except UntrustedFileError as exc:
        raise TenantsError(str(exc)) from None
    where = f"tenants file {source}"
    for key in raw:
        if key not in _TOP_LEVEL:
            raise TenantsError(f"{where}: unknown top-level key {key!r} (only "
                               "[tenants.<name>] tables and a [scheduling] table)")
    table = raw.get("tenants", {})
    if not isinstance(table, dict):
        raise TenantsError(f"{where}: 'tenants' must be tables [tenants.<name>], got "
                           f"{_shown(table)}")
    if not table:
        raise TenantsError(f"{where}: no tenants (add a [tenants.<name>] table for each)")
    tenants = {name: _tenant(where, name, entry) for name, entry in table.items()}
    _check_case_clashes(where, tenants)
    knobs = _scheduling(where, raw.get("scheduling", {}))
    _check_quotas_fit(where, tenants, knobs.get("capacity_gpus"))
    return TenantsConfig(tenants=tenants, source=source,
                         digest=hashlib.sha256(data).hexdigest(), **knobs)


def _tenant(where: str, name: str, entry: object) -> TenantPolicy:
    if not TENANT_NAME.fullmatch(name):
        raise TenantsError(f"{where}: tenant {name!r}: not a valid tenant name (1 to 50 "
                           "letters, digits, '_' or '-': it names the Airflow pool "
                           f"{pool_name('<name>')})")
    here = f"{where}: tenant {name!r}"
    if not isinstance(entry, dict):
        raise TenantsError(f"{here}: must be a table [tenants.{name}], got {_shown(entry)}")
    _check_keys(here, entry, _TENANT_FIELDS)
    for key, meaning in _REQUIRED.items():
        if key not in entry:
            raise TenantsError(f"{here}: {key}: missing ({meaning})")
    values: dict[str, Any] = {key: _TENANT_CHECKS[key](f"{here}: {key}", entry[key])
                              for key in _TENANT_FIELDS if key in entry}
    return TenantPolicy(name=name, **values)


def _check_case_clashes(where: str, tenants: Mapping[str, TenantPolicy]) -> None:
    """Two names that differ only in case would share a pool on a database whose names
    compare without case (MySQL's default collation)."""
    seen: dict[str, str] = {}
    for name in tenants:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            raise TenantsError(f"{where}: tenants {other!r} and {name!r} differ only in case "
                               "(their pools would clash on a case-insensitive database)")


def _check_quotas_fit(where: str, tenants: Mapping[str, TenantPolicy],
                      capacity: int | None) -> None:
    """A tenant's guarantee above the whole fleet can never be kept, not even on an idle
    fleet: refused. Guarantees that only add up to more than the fleet (each can be kept
    alone, not all at once) are `overcommitted`'s warning."""
    if capacity is None:
        return
    for name, policy in tenants.items():
        if policy.quota_gpus > capacity:
            raise TenantsError(f"{where}: tenant {name!r}: quota_gpus: {policy.quota_gpus} is "
                               f"more than [scheduling] capacity_gpus {capacity} (a guarantee "
                               "the fleet cannot give)")


def overcommitted(config: TenantsConfig) -> str | None:
    """A warning when the quotas add up to more than `capacity_gpus` (None when they fit,
    or when no capacity is set and the fleet is their sum): the controller then keeps
    each guarantee only while the others are not all claimed at once."""
    quotas = sum(p.quota_gpus for p in config.tenants.values())
    if config.capacity_gpus is None or quotas <= config.capacity_gpus:
        return None
    return (f"tenants file {config.source}: the quotas add up to {quotas} GPUs, more than "
            f"[scheduling] capacity_gpus {config.capacity_gpus}: the guarantees cannot all "
            "be kept at once")


def _scheduling(where: str, entry: object) -> dict[str, Any]:
    here = f"{where}: [scheduling]"
    if not isinstance(entry, dict):
        raise TenantsError(f"{here}: must be a table, got {_shown(entry)}")
    _refuse_replaced(here, entry)
    _check_keys(here, entry, _SCHEDULING_FIELDS)
    knobs: dict[str, Any] = {}
    for key in ("default_queue", "cpu_queue"):
        if key in entry:
            knobs[key] = _queue(f"{here}: {key}", entry[key])
    if "preemption" in entry:
        knobs["preemption"] = _flag(f"{here}: preemption", entry["preemption"])
    for key, rng in _SCHEDULING_RANGES.items():
        if key in entry:
            knobs[key] = _in_range(f"{here}: {key}", entry[key], rng)
    return knobs


def _refuse_replaced(here: str, entry: Mapping[str, object]) -> None:
    for key, instead in _REPLACED.items():
        if key in entry:
            raise TenantsError(f"{here}: {key}: replaced by {instead}")


def _check_keys(here: str, entry: Mapping[str, object], known: tuple[str, ...]) -> None:
    for key in entry:
        if key not in known:
            near = [k for k in known if key and k.startswith(key)] \
                or difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise TenantsError(f"{here}: {key}: unknown field ({hint}known: "
                               f"{', '.join(known)})")


# --- one field --------------------------------------------------------------------------


def _shown(value: object) -> str:
    """A value as the file spells it (`true`, not `True`; `nan`; strings in double quotes),
    so that an error quotes what the user wrote."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return str(value)


def _in_range(here: str, value: object, rng: Range) -> Any:
    """`value` when `rng` holds it (seconds as a float), else the error naming it."""
    why = rng.why(value)
    if why is not None:
        raise TenantsError(f"{here}: {_shown(value)} is not {why}")
    return value if rng.whole else float(value)  # type: ignore[arg-type]


def _flag(here: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TenantsError(f"{here}: {_shown(value)} is not true or false")
    return value


def _queue(here: str, value: object) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"\S+", value):
        raise TenantsError(f"{here}: {_shown(value)} is not a queue name (a non-empty string "
                           "without blanks)")
    return value


def _ranged(rng: Range) -> Callable[[str, object], Any]:
    return lambda here, value: _in_range(here, value, rng)


#: Each field's check; the ranges, and why they are plausible, are in `limits`.
_TENANT_CHECKS: Final[dict[str, Callable[[str, object], Any]]] = {
    "priority": _ranged(limits.PRIORITY),
    "quota_gpus": _ranged(limits.QUOTA_GPUS),
    "borrow_limit_gpus": _ranged(limits.BORROW_LIMIT_GPUS),
    "preemptible": _flag,
    "min_run_s": _ranged(limits.MIN_RUN_S),
    "grace_s": _ranged(limits.GRACE_S),
    "max_preemptions_per_day": _ranged(limits.PREEMPTIONS_PER_DAY),
    "max_tts_s": _ranged(limits.MAX_TTS_S),
}
_SCHEDULING_RANGES: Final[dict[str, Range]] = {
    "aging_per_hour": limits.AGING_PER_HOUR,
    "capacity_gpus": limits.CAPACITY_GPUS,
    "resume_after_s": limits.RESUME_AFTER_S,
    "checkpoint_wait_price": limits.CHECKPOINT_WAIT_PRICE,
}


# --- the last good version ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TenantsState:
    """What is in force for one tenants file, and what went wrong with it.

    `config` is the last version of the file that was valid (None if none ever was);
    `loaded_at` when it was read. `error` is why the file as it is now cannot be used (None
    when it can), `error_at` when that was first seen: the caller logs it, and the fleet page
    shows it, next to the version still in force.
    """

    path: str
    config: TenantsConfig | None
    loaded_at: float | None = None
    error: str | None = None
    error_at: float | None = None

    @property
    def stale(self) -> bool:
        """The file is broken and an older, good version is in force."""
        return self.config is not None and self.error is not None


# What `stat` says about a file, to tell whether it changed: its inode (an editor or a
# ConfigMap that replaces the file by a rename makes a new one), size and modification
# time in nanoseconds; or, when it cannot be stat'ed, why.
_Signature = tuple[int, int, int] | tuple[str, int]

#: A file modified less than this long before it was read may be modified again with the
#: same size and the same mtime (the kernel stamps mtimes from a coarse clock, a few ms;
#: network file systems coarser still): its signature is not trusted, and it is read again
#: at the next call, until it has been quiet this long ("racy" files, as git calls them).
RACY_S: Final = 2.0


def _stat(path: str) -> tuple[_Signature, float | None]:
    """The file's signature, and its mtime in seconds (None when it cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return ("missing", exc.errno or 0), None
    return (st.st_ino, st.st_size, st.st_mtime_ns), st.st_mtime_ns / 1e9


@dataclass(frozen=True, slots=True)
class _Entry:
    signature: _Signature
    settled: bool  # the file was older than RACY_S when read: its signature can be trusted
    digest: str | None  # SHA-256 of the bytes read (None: unreadable)
    state: TenantsState


@dataclass
class TenantsCache:
    """The tenants files in force, by path: each re-read only when `stat` says it changed.

    `current(path)` costs one `stat` when the file is as it was (the cluster policies call
    it for every task they see) and never raises for a broken file: the last good version
    stays in force and the error is recorded (and logged once, when it is first seen).
    Safe to call from several threads: a change is loaded by one thread at a time, and a
    reader never sees a half-built state. `clock` stamps `loaded_at` and `error_at`.
    """

    clock: Callable[[], float] = time.time
    _entries: dict[str, _Entry] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def current(self, path: str | Path) -> TenantsState:
        key = os.fspath(Path(path).expanduser())
        entry = self._entries.get(key)
        if entry is not None and entry.settled and entry.signature == _stat(key)[0]:
            return entry.state
        with self._lock:
            # Stat again under the lock: another thread may have loaded this change. The
            # stat comes before the read, so a state is never older than its signature.
            signature, mtime = _stat(key)
            entry = self._entries.get(key)
            if entry is not None and entry.settled and entry.signature == signature:
                return entry.state
            settled = mtime is None or time.time() - mtime >= RACY_S
            self._entries[key] = entry = self._reload(key, signature, settled, entry)
            return entry.state

    def _reload(self, path: str, signature: _Signature, settled: bool,
                before: _Entry | None) -> _Entry:
        try:
            data = read_file(Path(path))
        except TenantsError as exc:
            return _Entry(signature, settled, None,
                          self._failed(path, str(exc), before.state if before else None))
        digest = hashlib.sha256(data).hexdigest()
        if before is not None and before.digest == digest:  # touched, or re-read while racy
            return _Entry(signature, settled, digest, before.state)
        try:
            config = parse_tenants(data, source=path)
        except TenantsError as exc:
            return _Entry(signature, settled, digest,
                          self._failed(path, str(exc), before.state if before else None))
        except Exception as exc:  # a parser bug must not drop the last good version
            message = f"{_WHAT} {path}: cannot be used: {type(exc).__name__}: {exc}"
            return _Entry(signature, settled, digest,
                          self._failed(path, message, before.state if before else None))
        if before is not None and before.state.error is not None:
            _log.warning("tenants file %s: valid again (sha256 %s), now in force", path,
                         digest[:12])
        else:
            _log.info("tenants file %s: %d tenant(s) in force (sha256 %s)", path,
                      len(config.tenants), digest[:12])
        if (warning := overcommitted(config)) is not None:
            _log.warning("%s", warning)
        return _Entry(signature, settled, digest,
                      TenantsState(path=path, config=config, loaded_at=self.clock()))

    def _failed(self, path: str, message: str, before: TenantsState | None) -> TenantsState:
        if before is not None and before.error == message:  # the same breakage, seen again
            return before
        now = self.clock()
        if before is not None and before.config is not None:
            _log.warning("%s; the version loaded at %s stays in force", message,
                         _utc(before.loaded_at))
            return TenantsState(path=path, config=before.config, loaded_at=before.loaded_at,
                                error=message, error_at=now)
        _log.error("%s; no tenant policy is in force", message)
        return TenantsState(path=path, config=None, error=message, error_at=now)

    def clear(self) -> None:
        """Forget every file (the next call reads each afresh)."""
        with self._lock:
            self._entries.clear()


def _utc(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


_CACHE: Final = TenantsCache()


def current(path: str | Path) -> TenantsState:
    """`TenantsCache.current` on the process's one cache (what the cluster policies use)."""
    return _CACHE.current(path)


def tenants_file_from_settings() -> Path | None:
    """`[ett] tenants_file`, or None when it is empty: no tenants file, the scheduling
    plugin is off. `TenantsError` if the configuration itself cannot be read."""
    from airflow_ett.settings import SettingsError, raw_setting

    try:
        value = raw_setting("tenants_file").strip()
    except SettingsError as exc:
        raise TenantsError(str(exc)) from None
    return Path(value).expanduser() if value else None
