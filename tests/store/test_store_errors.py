"""Errors: one line, URL named with the password masked, unavailability told apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ett.store import EttStore, StoreError, StoreUnavailable, mask_url, upgrade
from tests.store.ett_store_helpers import job_events

SECRET = "s3cr%40t"


def _one_line_and_masked(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message
    assert SECRET not in message and "s3cr" not in message
    return message


@pytest.mark.parametrize("url", ["not a url", "://", "sqlite+nosuchdriver:///x.db"])
def test_bad_url_is_a_store_error(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        EttStore(url)
    assert not isinstance(caught.value, StoreUnavailable)
    assert "\n" not in str(caught.value)


def test_unsupported_database_names_the_masked_url() -> None:
    with pytest.raises(StoreError, match="unsupported") as caught:
        EttStore(f"mysql://ett:{SECRET}@db.example/ett")
    assert "ett:***@db.example" in _one_line_and_masked(caught.value)


def test_in_memory_sqlite_is_refused() -> None:
    with pytest.raises(StoreError, match="in-memory"):
        EttStore("sqlite://")


def test_mask_url_handles_unparseable_text() -> None:
    assert mask_url(f"weird://u:{SECRET}@h:x:y/z") == "weird://u:***@h:x:y/z"
    assert mask_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"


def test_unreachable_postgres_is_unavailable() -> None:
    url = f"postgresql+psycopg2://ett:{SECRET}@127.0.0.1:1/ett"
    store = EttStore(url)  # connects lazily
    try:
        with pytest.raises(StoreUnavailable) as caught:
            store.ping()
        message = _one_line_and_masked(caught.value)
        assert "127.0.0.1:1" in message and "***" in message
        with pytest.raises(StoreUnavailable):
            store.insert_events(job_events("j"))
        assert store.insert_events([]) == 0  # nothing to write: no connection needed
    finally:
        store.close()
    with pytest.raises(StoreUnavailable) as caught:
        upgrade(url)
    _one_line_and_masked(caught.value)


def test_unwritable_sqlite_path_is_unavailable(tmp_path: Path) -> None:
    # Only upgrade creates a SQLite file and its folders; the store itself never does.
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="cannot create") as caught:
        upgrade(f"sqlite:///{blocker / 'ett.db'}")
    assert "\n" not in str(caught.value)
    with EttStore(f"sqlite:///{blocker / 'ett.db'}") as store, \
            pytest.raises(StoreError, match="does not exist"):
        store.ping()


def test_sqlite_path_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "ett.db").mkdir()  # a directory where the file should be
    with EttStore(f"sqlite:///{tmp_path / 'ett.db'}") as store, \
            pytest.raises(StoreUnavailable, match="unable to open"):
        store.ping()


def test_unavailable_is_a_store_error() -> None:
    assert issubclass(StoreUnavailable, StoreError)
