"""Two rollups of the same day at once, on both backends: both succeed (one waits for the
other) and the day's rows are whole, never a duplicate-key error (PostgreSQL's was in 3
of 7 rounds when the second rollup's DELETE ran before the first committed its INSERT).

The overlap is made, not hoped for: rollup A stops just before it commits (its DELETE and
INSERT done, its locks held) until rollup B is seen blocked behind it: on PostgreSQL a
backend of B's waiting on a lock (pg_stat_activity), on SQLite B's write transaction about
to begin (SQLite serialises writers with BEGIN IMMEDIATE and shows no waiter). Only then
does A commit, and B goes on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from airflow_ett.rollup import ComponentsConfig, DayRollup, load_components
from airflow_ett.store import EttStore
from airflow_ett.store.schema import daily_jobs
from tests.rollup.scenarios import LO, WINDOW, job_a, job_b

NOW = LO + 2 * 86400
ROUNDS = 3
WAIT_S = 60.0  # a bound for a wedged test only: every wait below ends on a state


def _blocked_on_a_lock(probe: EttStore, pids: set[int]) -> Callable[[], bool]:
    """Whether one of `pids` (rollup B's backends) waits on a lock, asked of the server."""
    def check() -> bool:
        with probe.engine.connect() as conn:
            waiting = conn.execute(sa.text(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'")).scalars()
            return bool(pids & set(waiting))
    return check


def _until(condition: Callable[[], bool], what: str) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.02)):
        if condition():
            return
        done.wait(0.02)
    raise AssertionError(f"not within {WAIT_S} s: {what}")


@contextmanager
def _paused_before_commit(store: EttStore, hold: Callable[[], None]) -> Iterator[None]:
    """Run `hold()` just before the store's write transaction that replaced a day commits
    (after its DELETE and INSERT: that is when the other rollup must run into it)."""
    wrote: list[bool] = []

    def on_execute(conn: Any, clauseelement: Any, *args: Any) -> None:
        if isinstance(clauseelement, sa.Delete) and clauseelement.table is daily_jobs:
            wrote.append(True)

    def on_commit(conn: Any) -> None:
        if wrote:
            wrote.clear()
            hold()

    sa.event.listen(store.engine, "before_execute", on_execute)
    sa.event.listen(store.engine, "commit", on_commit)
    try:
        yield
    finally:
        sa.event.remove(store.engine, "before_execute", on_execute)
        sa.event.remove(store.engine, "commit", on_commit)


def _race(url: str, backend: str, components: ComponentsConfig
          ) -> dict[str, DayRollup | BaseException]:
    """One round: rollups A and B of the same day, B run into A's held transaction."""
    with EttStore(url) as a, EttStore(url) as b, EttStore(url) as probe:
        b_pids: set[int] = set()
        b_begins = threading.Event()
        b_blocked: Callable[[], bool]
        if backend == "postgres":
            sa.event.listen(b.engine, "connect",
                            lambda dbapi, _: b_pids.add(dbapi.get_backend_pid()))
            b_blocked = _blocked_on_a_lock(probe, b_pids)
        else:  # B is about to send its write transaction's BEGIN IMMEDIATE
            def before(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
                if statement == "BEGIN IMMEDIATE":
                    b_begins.set()

            sa.event.listen(b.engine, "before_cursor_execute", before)
            b_blocked = b_begins.is_set
        a_holds = threading.Event()
        results: dict[str, DayRollup | BaseException] = {}

        def hold() -> None:
            a_holds.set()
            _until(b_blocked, "rollup B waits behind rollup A")

        def roll(name: str, store: EttStore) -> None:
            try:
                if name == "b":
                    a_holds.wait(WAIT_S)
                results[name] = store.daily.compute_day(WINDOW, components, now=NOW)
            except BaseException as exc:  # reported by the caller's assertion
                results[name] = exc

        with _paused_before_commit(a, hold):
            threads = [threading.Thread(target=roll, args=(n, s)) for n, s in (("a", a),
                                                                               ("b", b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(WAIT_S * 2)
        assert a_holds.is_set()
        return results


@pytest.mark.integration
def test_two_rollups_of_the_same_day_at_once_both_succeed(store_url: str,
                                                          backend: str) -> None:
    with EttStore(store_url) as seed:
        seed.insert_events([*job_a(), *job_b()])
        expected = seed.daily.compute_day(WINDOW, load_components(), now=NOW)
    components = load_components()
    for _ in range(ROUNDS):  # the day's rows exist each round: the case that raced
        results = _race(store_url, backend, components)
        assert set(results) == {"a", "b"}
        assert all(isinstance(r, DayRollup) for r in results.values()), results
        with EttStore(store_url) as check:
            assert check.daily.day(WINDOW.iso) == expected
            assert sorted(r["job"] for r in check.daily.job_rows(WINDOW.iso)) == ["a", "b"]
            groups = check.daily.group_rows(WINDOW.iso, "tenant")
            assert sorted(g["key"] for g in groups) == ["t1", "t2"]
