"""Credentials never shown: `mask_url` / `mask_text` on URLs that parse and ones that do
not, and every message of the CLI and the store that names a store URL."""

from __future__ import annotations

import pytest

from airflow_ett.cli import main
from airflow_ett.masking import mask_text, mask_url


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql+psycopg2://postgres@127.0.0.1:5999/ett?password=QuerySecret",
     "postgresql+psycopg2://postgres@127.0.0.1:5999/ett?password=***"),
    ("postgresql://u:p@ssW0rd@127.0.0.1/ett", "postgresql://u:***@127.0.0.1/ett"),
    ("postgresql://u:p@s:s/w?d@h:5432/db?x=1", "postgresql://u:***@h:5432/db?x=1"),
    ("postgresql://u:p%40ss%3Aw@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:pw@[::1]:5432/db", "postgresql://u:***@[::1]:5432/db"),
    ("postgresql://u:p@ss@h/db?application_name=a@b", "postgresql://u:***@h/db?application_name=a@b"),
    ("postgresql://u@h/db?sslmode=require&sslpassword=a&b&application_name=x",
     "postgresql://u@h/db?sslmode=require&sslpassword=***&application_name=x"),
    ("postgresql://u@h/db?PWD=x;api_key=y&token=z&passwd=w&secret=v",
     "postgresql://u@h/db?PWD=***;api_key=***&token=***&passwd=***&secret=***"),
    ("not a url u:pa@ss@host/x", "not a url u:***@host/x"),
    ("sp ace://u:se@cr:et@h/d", "sp ace://u:***@h/d"),
    ("weird://u:s3cr%40t@h:x:y/z", "weird://u:***@h:x:y/z"),
    ("host=h password=sekrit dbname=x", "host=h password=*** dbname=x"),
    ("sqlite:////tmp/ett.db", "sqlite:////tmp/ett.db"),
    ("postgresql+psycopg2://u@h/db", "postgresql+psycopg2://u@h/db"),
    ("", ""),
])
def test_mask_url(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_mask_url_never_raises() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert mask_url(Hostile()) == "***"
    assert mask_url(None) == "None"
    assert mask_text(Hostile()) == "***"


def test_mask_text_masks_urls_and_dsn_values_inside_a_message() -> None:
    text = ('connect to postgresql://ett:hunter2pw@db/ett failed: password=hunter2pw '
            "and sslpassword='two words' rejected")
    masked = mask_text(text)
    assert "hunter2pw" not in masked and "two words" not in masked
    assert masked.startswith("connect to postgresql://ett:***@db/ett failed")


@pytest.mark.parametrize(("url", "secret"), [
    ("postgresql+psycopg2://postgres@127.0.0.1:1/ett?password=QuerySecret", "QuerySecret"),
    ("postgresql+psycopg2://postgres:Hunter@Two@127.0.0.1:1/ett", "Two"),
    ("postgresql+psycopg2://postgres:Hunter%40Two@127.0.0.1:1/ett", "Hunter"),
    ("postgresql://postgres@127.0.0.1:1/ett?sslpassword=SslSecret&sslmode=require",
     "SslSecret"),
    ("mysql://u:MySecret@h/db", "MySecret"),
    ("postgresql+psycopg2://u:Bad/Secret@h:notaport/db", "Secret"),
])
@pytest.mark.parametrize("command", [["runs", "list"], ["db", "upgrade"],
                                     ["runs", "show", "x"]])
def test_no_cli_error_shows_a_store_secret(capsys: pytest.CaptureFixture[str], url: str,
                                           secret: str, command: list[str]) -> None:
    assert main([*command, "--store-url", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("airflow-ett: error:") and len(err.strip().splitlines()) == 1
    assert secret not in err, err


def test_store_repr_and_sink_repr_are_masked() -> None:
    from airflow_ett.emit.sinks import StoreSink
    from airflow_ett.store import EttStore

    url = "postgresql://u:ReprSecret@h/db?token=TokSecret"
    store = EttStore(url)
    try:
        for shown in (repr(store), store.url, repr(StoreSink(url))):
            assert "ReprSecret" not in shown and "TokSecret" not in shown, shown
    finally:
        store.close()
