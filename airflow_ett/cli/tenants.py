"""`airflow-ett tenants`: check a tenants file, and make Airflow's pools say what it says.

`check FILE` validates the file and prints each tenant's effective policy (defaults
filled in) and its pool, the fleet-wide knobs preemption runs by, and a warning for each
tenant whose `grace_s` is shorter than its jobs' measured checkpoint saves (read from the
ETT store; `--no-store` checks the file alone).

`sync [FILE]` creates or resizes one pool per tenant, `ett_tenant_<name>`, with
`quota_gpus + borrow_limit_gpus` slots: the most GPUs the tenant may hold at once. The
pool is the ceiling; the guarantee below it (`quota_gpus`) is kept by the preemption
controller, which takes borrowed GPUs back when another tenant waits under its quota
(docs/decisions/0013-tenants-file.md).

`sync` writes through Airflow's own `Pool` model in this process, so it runs where the
metadata database is reachable (a scheduler or API-server host, an admin shell), with that
installation's `AIRFLOW_HOME`. It is idempotent, and it never deletes a pool: a tenant
taken out of the file may still have tasks queued in its pool, so its pool is listed and
left for a person to delete. Airflow is imported inside the command only.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from airflow_ett.cli.common import MAX_DAYS, fail, int_in, store_url, with_store

if TYPE_CHECKING:

    from airflow_ett.cli.common import Subcommands
    from airflow_ett.scheduling.model import TenantPolicy
    from airflow_ett.scheduling.tenants import TenantsConfig


def add_parser(sub: Subcommands) -> None:
    tenants = sub.add_parser(
        "tenants", help="check a tenants file; create or resize the pools of its quotas"
    ).add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    check = tenants.add_parser(
        "check", help="validate a tenants file and show each tenant's effective policy",
        description="Validate a tenants file (TOML) whole and print each tenant's policy "
                    "with the defaults filled in, and the Airflow pool of its quota; the "
                    "fleet's [scheduling] knobs; and, from the ETT store, each tenant's p90 "
                    "checkpoint save against its grace_s, with a warning where the grace "
                    "is shorter. Exit status 1, with the error, when the file cannot be "
                    "used; warnings, and a store that cannot be read, leave it 0.")
    check.add_argument("file", metavar="FILE", help="the tenants file (TOML)")
    with_store(check)
    check.add_argument("--days", type=int_in(1, MAX_DAYS), default=7,
                       help="the checkpoint saves of the last DAYS days (default: 7)")
    check.add_argument("--no-store", action="store_true",
                       help="check the file alone: do not read the ETT store")
    check.set_defaults(func=check_command)
    sync = tenants.add_parser(
        "sync", help="create or resize one Airflow pool per tenant (never deletes one)",
        description="Make Airflow's pools match the tenants file: one pool ett_tenant_<name> "
                    "per tenant with quota_gpus + borrow_limit_gpus slots. Writes Airflow's "
                    "metadata database directly: run it where that database is reachable. "
                    "A second run changes nothing. Pools of tenants no longer in the file "
                    "are listed and left as they are.")
    sync.add_argument("file", metavar="FILE", nargs="?",
                      help="the tenants file (default: [ett] tenants_file)")
    sync.add_argument("--dry-run", action="store_true",
                      help="print what would change, write nothing")
    sync.set_defaults(func=sync_command)


def _load(path: str) -> TenantsConfig:
    from airflow_ett.scheduling.tenants import TenantsError, load_tenants

    try:
        return load_tenants(path)
    except TenantsError as exc:
        fail(str(exc))


def _amount(value: float) -> str:
    return f"{value:g}"


# --- check -------------------------------------------------------------------------------


def check_command(args: argparse.Namespace) -> int:
    from airflow_ett import console

    config = _load(args.file)
    terminal = console.is_terminal()

    def right(name: str) -> console.Column:
        return console.Column(name, justify="right")

    columns: list[str | console.Column] = [
        "tenant", right("priority"), right("quota_gpus"), right("borrow_limit_gpus"),
        right("pool slots"), "preemptible", right("min_run_s"), right("grace_s"),
        right("max_preemptions_per_day"), "pool"]
    policies = list(config.tenants.values())
    rows = [(p.name, str(p.priority), str(p.quota_gpus), str(p.borrow_limit_gpus),
             str(p.limit_gpus), "true" if p.preemptible else "false", _amount(p.min_run_s),
             _amount(p.grace_s), str(p.max_preemptions_per_day), p.pool) for p in policies]
    totals = [("total", "", str(sum(p.quota_gpus for p in policies)),
               str(sum(p.borrow_limit_gpus for p in policies)),
               str(sum(p.limit_gpus for p in policies)), "", "", "", "", "")]
    console.line(f"tenants file {config.source}: valid, {len(policies)} tenant(s) "
                 f"(sha256 {config.digest[:12]})")
    console.emit(console.table(columns, rows, totals=totals, terminal=terminal))
    console.line(f"scheduling: a waiting task gains {_amount(config.aging_per_hour)} priority "
                 f"point(s) per hour; GPU (train) tasks go to queue {config.default_queue!r}, "
                 f"the others to {config.cpu_queue!r}")
    for text in scheduling_lines(config):
        console.line(text)
    if not args.no_store:
        for text in _grace_lines(config, args):
            console.line(text)
    return 0


def scheduling_lines(config: TenantsConfig) -> list[str]:
    """The fleet-wide knobs preemption runs by, as `check` prints them: what a tenant's
    policy means depends on them (a quota counts against the fleet's GPUs; a grace is
    used only when preemption is on and a victim yields at once)."""
    from airflow_ett.scheduling.tenants import overcommitted

    quotas = sum(p.quota_gpus for p in config.tenants.values())
    if config.capacity_gpus is None:
        fleet = f"the quotas' sum, {quotas} (capacity_gpus not set)"
    else:
        fleet = f"capacity_gpus {config.capacity_gpus} (the quotas add up to {quotas})"
    warning = overcommitted(config)
    from airflow_ett.scheduling.model import MAX_WAIT_PRICE

    price = config.checkpoint_wait_price
    if price >= MAX_WAIT_PRICE:
        waits = "every victim yields at once, within its tenant's grace_s"
    elif price == 0:
        waits = ("a victim whose next periodic checkpoint is known yields right after it, "
                 "however long the waiting job waits; others at once, within their "
                 "tenant's grace_s")
    else:
        waits = (f"a victim yields right after its next periodic checkpoint when the work "
                 f"that saves (GPU-seconds) is at least {_amount(price)} x the waiting job's "
                 "GPUs x its longer wait x its priority's weight (1 at the highest "
                 "priority, 0 at the lowest), else at once, within its tenant's grace_s")
    return [
        f"scheduling: preemption counts free GPUs against {config.fleet_gpus} GPUs: {fleet}",
        ("scheduling: preemption is on: the controller preempts victims" if config.preemption
         else "scheduling: preemption is off: the controller only logs what it would do"),
        f"scheduling: a preempted job may run again {_amount(config.resume_after_s)} s "
        "after its preemption (resume_after_s)",
        f"scheduling: checkpoint_wait_price {_amount(price)}: {waits}",
        *([] if warning is None else [f"warning: {warning}"]),
    ]


def _grace_lines(config: TenantsConfig, args: argparse.Namespace) -> list[str]:
    """Each tenant's grace against its jobs' measured saves; one line saying why not
    when the store cannot be read (a check of the file must not fail for want of it)."""
    import time

    from airflow_ett.scheduling.save_times import check_grace, grace_line
    from airflow_ett.settings import SettingsError
    from airflow_ett.store import EttStore, StoreError

    try:
        with EttStore(store_url(args)) as store:
            save_s = store.checkpoint_save_times(config.tenants,
                                                 since=time.time() - args.days * 86400.0)
    except (StoreError, SettingsError) as exc:
        # The error names the store (its URL masked) or the setting that is wrong.
        return ["checkpoint saves: not read, so no grace_s is checked against them: "
                f"{' '.join(str(exc).split())}"]
    return [grace_line(check, days=args.days, wait_price=config.checkpoint_wait_price)
            for check in check_grace(config.tenants, save_s)]


# --- sync: the plan (pure) ---------------------------------------------------------------

Action = Literal["create", "resize", "update", "ok"]


@dataclass(frozen=True, slots=True)
class PoolRow:
    """An Airflow pool as `sync` reads it (what it keeps as it is: `include_deferred`,
    `team_name`, are passed back unchanged)."""

    name: str
    slots: int
    description: str
    include_deferred: bool
    team_name: str | None = None


@dataclass(frozen=True, slots=True)
class PoolChange:
    """What `sync` does to one tenant's pool: `create` it, `resize` it (slots, and the
    description with them), `update` only its description, or leave it (`ok`)."""

    action: Action
    tenant: TenantPolicy
    slots: int
    description: str
    old_slots: int | None = None

    @property
    def pool(self) -> str:
        return self.tenant.pool


def pool_description(policy: TenantPolicy) -> str:
    """The pool's description: who manages it, and the quota and borrowing it is sized by."""
    return (f"managed by airflow-ett tenants sync: tenant {policy.name!r}, quota "
            f"{policy.quota_gpus} + borrow {policy.borrow_limit_gpus} = {policy.limit_gpus} "
            "GPUs; edit the tenants file, not this pool")


def plan_pools(config: TenantsConfig,
               existing: Mapping[str, PoolRow]) -> tuple[list[PoolChange], list[PoolRow]]:
    """Each tenant's change, in file order; and the `ett_tenant_` pools the file no longer
    names (to list, never to delete), by name."""
    from airflow_ett.scheduling.model import POOL_PREFIX

    changes: list[PoolChange] = []
    for policy in config.tenants.values():
        description = pool_description(policy)
        row = existing.get(policy.pool)
        action: Action
        if row is None:
            action = "create"
        elif row.slots != policy.limit_gpus:
            action = "resize"
        elif row.description != description:
            action = "update"
        else:
            action = "ok"
        changes.append(PoolChange(action, policy, policy.limit_gpus, description,
                                  None if row is None else row.slots))
    ours = set(config.pools.values())
    gone = [row for name, row in sorted(existing.items())
            if name.startswith(POOL_PREFIX) and name not in ours]
    return changes, gone


# --- sync: Airflow -----------------------------------------------------------------------


def sync_command(args: argparse.Namespace) -> int:
    path = args.file or _file_from_settings()
    config = _load(path)
    changes, gone = _sync_pools(config, dry_run=args.dry_run)
    _print_sync(config, changes, gone, dry_run=args.dry_run)
    return 0


def _file_from_settings() -> str:
    from airflow_ett.scheduling.tenants import TenantsError, tenants_file_from_settings

    try:
        path = tenants_file_from_settings()
    except TenantsError as exc:
        fail(str(exc))
    if path is None:
        fail("no tenants file: give FILE, or set [ett] tenants_file "
             "(AIRFLOW__ETT__TENANTS_FILE)")
    return str(path)


def _sync_pools(config: TenantsConfig, *,
                dry_run: bool) -> tuple[list[PoolChange], list[PoolRow]]:
    """Read Airflow's pools, plan, and (unless `dry_run`) write the changes, all in one
    transaction of Airflow's own session: nothing is written if any of it fails."""
    try:
        from airflow.models.pool import Pool
        from airflow.utils.session import create_session
        from sqlalchemy.exc import SQLAlchemyError
    except ImportError as exc:
        fail(f"tenants sync writes Airflow's pools, and Airflow cannot be imported here: {exc}")
    try:
        with create_session() as session:
            existing = {
                pool.pool: PoolRow(pool.pool, int(pool.slots), pool.description or "",
                                   bool(pool.include_deferred), pool.team_name)
                for pool in Pool.get_pools(session=session) if pool.pool}
            changes, gone = plan_pools(config, existing)
            for change in changes:
                if dry_run or change.action == "ok":
                    continue
                row = existing.get(change.pool)
                # A new pool leaves out deferred tasks (they hold no GPU); an existing one
                # keeps what an admin chose for it.
                Pool.create_or_update_pool(
                    change.pool, change.slots, change.description,
                    include_deferred=row.include_deferred if row is not None else False,
                    team_name=row.team_name if row is not None else None, session=session)
    except (SQLAlchemyError, ValueError) as exc:
        message = " ".join(str(exc).split())
        fail(f"Airflow's pools could not be read or written: {message}")
    return changes, gone


# How a summary says each change: done, and planned (a dry run).
_DONE: dict[Action, tuple[str, str]] = {"create": ("created", "to create"),
                                        "resize": ("resized", "to resize"),
                                        "update": ("description updated",
                                                   "description to update")}


def _print_sync(config: TenantsConfig, changes: list[PoolChange], gone: list[PoolRow], *,
                dry_run: bool) -> None:
    from airflow_ett import console

    terminal = console.is_terminal()
    console.line(f"tenants file {config.source}: {len(changes)} tenant(s)")
    rows = []
    for c in changes:
        slots = str(c.slots) if c.old_slots in (None, c.slots) else f"{c.old_slots} -> {c.slots}"
        action = f"would {c.action}" if dry_run and c.action != "ok" else c.action
        rows.append((action, c.pool, slots,
                     f"{c.tenant.quota_gpus} + {c.tenant.borrow_limit_gpus}"))
    console.emit(console.table(["action", "pool", "slots", "quota + borrow"], rows,
                               terminal=terminal))
    if gone:
        console.line("no longer in the file (left as they are; `airflow pools delete NAME` "
                     "once no task uses one):")
        console.emit(console.indent(console.table(
            ["pool", "slots"], [(row.name, str(row.slots)) for row in gone],
            terminal=terminal)))
    counts = {a: sum(c.action == a for c in changes) for a in _DONE}
    unchanged = sum(c.action == "ok" for c in changes)
    if not any(counts.values()):
        console.line(f"nothing to change: the {unchanged} pool(s) already match the file")
    elif dry_run:
        planned = [f"{counts[a]} {words[1]}" for a, words in _DONE.items() if counts[a]]
        console.line(f"dry run: {', '.join(planned)}, {unchanged} unchanged; nothing written")
    else:
        done = [f"{counts[a]} {words[0]}" for a, words in _DONE.items() if counts[a]]
        console.line(f"synced: {', '.join(done)}, {unchanged} unchanged")
    sys.stdout.flush()
