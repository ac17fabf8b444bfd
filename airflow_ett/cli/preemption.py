"""`airflow-ett preemption run`: the preemption controller (`airflow_ett/plugin/controller.py`)
as a process of its own, beside the scheduler (docs/decisions/0015-preemption.md).

`--once` looks once, prints what it decided and why, and exits (for a cron job, a
readiness check, or a platform engineer asking "what would it do now?"); without it the
controller ticks every `--interval` seconds until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING

from airflow_ett.cli.common import MAX_INTERVAL_S, fail, int_in

if TYPE_CHECKING:
    from airflow_ett.cli.common import Subcommands
    from airflow_ett.plugin.controller import Tick


def add_parser(sub: Subcommands) -> None:
    group = sub.add_parser(
        "preemption", help="the preemption controller: who yields GPUs to whom, and why"
    ).add_subparsers(dest="preemption_command", required=True, metavar="ACTION")
    run = group.add_parser(
        "run", help="run the preemption controller (or look once with --once)",
        description="Read the train tasks waiting for and holding GPUs (Airflow's metadata "
                    "database) and where each running job is (the ETT store), choose the "
                    "victims by the tenants file's rules, and ask each to checkpoint and "
                    "yield (a request in its job directory). Acts only when the tenants "
                    "file says [scheduling] preemption = true; otherwise it says what it "
                    "would do. Run it where the metadata database and [ett] work_dir are "
                    "reachable, once per deployment.")
    run.add_argument("--once", action="store_true", help="look once, print, exit")
    run.add_argument("--interval", type=int_in(1, MAX_INTERVAL_S), default=10, metavar="S",
                     help="seconds between looks (default 10)")
    run.add_argument("--store-url", help="SQLAlchemy URL (default: [ett] store_url)")
    run.set_defaults(func=run_command)


def _print_tick(tick: Tick) -> None:
    """What the tick decided, a line each (through the console: job ids and reasons quote
    names other people chose)."""
    from airflow_ett.console import line

    if tick.note:
        line(tick.note)
        return
    state = tick.state
    assert state is not None
    line(f"{len(state.running)} running, {len(state.waiting)} waiting, "
         f"{state.free_gpus} of {state.capacity_gpus} GPUs free")
    for decision in tick.decisions:
        line(f"{decision.for_job}: {decision.reason}")
        for p in decision.preemptions:
            mark = ("asked to yield" if p.victim in tick.requested else
                    "still yielding" if p.victim in tick.pending else "not asked")
            line(f"  {p.reason} [{mark}]")
    for label, jobs in (("yielding", tick.pending), ("request withdrawn", tick.withdrawn),
                        ("escalated to yield now", tick.escalated),
                        ("overdue (left to Airflow's heartbeat check)", tick.overdue)):
        if jobs:
            line(f"{label}: {', '.join(jobs)}")
    sys.stdout.flush()


def run_command(args: argparse.Namespace) -> int:
    from airflow_ett.plugin.controller import run_forever, tick_once

    if args.once:
        try:
            _print_tick(tick_once(store_url=args.store_url))
        except Exception as exc:
            fail(f"preemption: {exc}")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"preemption controller: a look every {args.interval} s (SIGTERM to stop)",
          flush=True)
    run_forever(float(args.interval), stop=stop, store_url=args.store_url,
                on_tick=lambda t: _print_tick(t) if t.decisions else None)
    return 0
