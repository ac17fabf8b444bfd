"""The `data` table an owner writes: read typed, defaults per format, one line per mistake,
and no file opened (a DAG file validates it at parse time)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.trainer.schema import (
    CRITEO_COLUMNS,
    CRITEO_DENSE,
    DataSpecError,
    read_data_spec,
    schema_from_dict,
)


def test_criteo_tsv_defaults_are_torchrecs_layout_and_hex_ids(tmp_path: Path) -> None:
    spec = read_data_spec({"format": "criteo_tsv", "paths": "day_*.tsv",
                           "schema": {"num_embeddings": 1000}}, base=tmp_path)
    assert spec.paths == (str(tmp_path / "day_*.tsv"),)
    assert spec.columns == CRITEO_COLUMNS and spec.schema.dense == CRITEO_DENSE
    assert [f.name for f in spec.schema.sparse] == [f"cat_{i}" for i in range(26)]
    assert {(f.encoding, f.num_embeddings, f.max_ids) for f in spec.schema.sparse} == {
        ("hex", 1000, 1)}
    assert spec.dense_transform == "log1p" and spec.max_bad_rows == 100
    npy = read_data_spec({"format": "criteo_npy", "paths": ["/d/day_0_dense.npy"],
                          "schema": {"sparse": {"cat_3": 50}}})
    assert [(f.name, f.encoding) for f in npy.schema.sparse] == [("cat_3", "modulo")]
    assert npy.dense_transform == "none"


def test_parquet_list_and_mapping_forms_and_vocabulary(tmp_path: Path) -> None:
    spec = read_data_spec({
        "format": "parquet", "paths": ["/a.parquet", "/b/*.parquet"], "max_bad_rows": 0,
        "schema": {"label": "click", "dense": ["age"], "sparse": [
            {"name": "user", "column": "user_id", "num_embeddings": 10, "encoding": "id"},
            {"name": "tags", "num_embeddings": 64, "max_ids": 8},
            {"name": "country", "num_embeddings": 300, "encoding": "vocabulary",
             "vocabulary": "countries.txt"}]}}, base=tmp_path)
    user, tags, country = spec.schema.sparse
    assert (user.column, user.encoding) == ("user_id", "id")
    assert (tags.column, tags.encoding, tags.max_ids) == ("tags", "hash", 8)
    assert country.vocabulary == tmp_path / "countries.txt"
    assert spec.schema.feature_names == ["user", "tags", "country"]
    assert schema_from_dict(spec.schema.to_dict()) == spec.schema
    # the identity's fingerprint: shapes, not encodings
    other = read_data_spec({"format": "parquet", "paths": "/x", "schema": {
        "label": "click", "dense": ["age"], "sparse": {"user": {"num_embeddings": 10},
                                                       "tags": 64, "country": 300}}})
    assert other.schema.fingerprint() == spec.schema.fingerprint()


BASE: dict[str, Any] = {"format": "criteo_tsv", "paths": "/d/*.tsv",
                        "schema": {"num_embeddings": 10}}


@pytest.mark.parametrize(("change", "says"), [
    ({"format": "csv"}, "data: format = 'csv': must be one of"),
    ({"format": "synthetic"}, "format = 'synthetic': is the bundled models' generated log"),
    ({"paths": []}, "paths = []: must have at least 1 item"),
    ({"paths": [7]}, "paths[0] = 7: must be a path"),
    ({"pathz": "x"}, "unknown key(s) ['pathz']"),
    ({"schema": {}}, "schema.sparse['cat_0'].num_embeddings = None: missing"),
    ({"schema": {"sparse": {"cat_0": 0}}}, "num_embeddings = 0: must be >= 1"),
    ({"schema": {"sparse": {"cat_0": True}}}, "schema.sparse['cat_0'] = True: must be a mapping"),
    ({"schema": {"sparse": {"cat_0": {"num_embeddings": 5, "encoding": "md5"}}}},
     "encoding = 'md5': must be one of"),
    ({"schema": {"sparse": {"cat_0": {"num_embeddings": 5, "encoding": "vocabulary"}}}},
     "vocabulary = None: a vocabulary file goes with encoding = 'vocabulary'"),
    ({"schema": {"sparse": {"cat_0": 5}, "dense": ["int_0", "int_0"]}},
     "schema.dense = ['int_0', 'int_0']: columns must be unique"),
    ({"schema": {"sparse": {"label": 5}}}, "schema.label = 'label': is also a feature's column"),
    ({"schema": {"sparse": {"x": 5}}}, "schema.sparse['x'].column = 'x': not one of the line's"),
    ({"columns": ["label", "a"], "schema": {"sparse": {"a": 5}}},
     "schema.dense[0] = 'int_0': not one of the line's columns"),
    ({"max_bad_rows": -1}, "max_bad_rows = -1: must be >= 0"),
    ({"max_bad_rows": 1.5}, "max_bad_rows = 1.5: must be an integer"),
    ({"dense_transform": "log"}, "dense_transform = 'log': must be one of"),
])
def test_every_mistake_is_one_line_naming_the_field(change: dict[str, Any], says: str) -> None:
    with pytest.raises(DataSpecError) as caught:
        read_data_spec({**BASE, **change})
    message = str(caught.value)
    assert says in message and "\n" not in message


def test_npy_paths_name_the_dense_files_and_columns_are_tsv_only() -> None:
    with pytest.raises(DataSpecError, match=r"paths\[0\] = '/d/day_0.npy': criteo_npy paths"):
        read_data_spec({"format": "criteo_npy", "paths": "/d/day_0.npy",
                        "schema": {"num_embeddings": 4}})
    with pytest.raises(DataSpecError, match=r"columns = .*: is for criteo_tsv data only"):
        read_data_spec({"format": "parquet", "paths": "/p", "columns": ["a", "b"],
                        "schema": {"dense": [], "sparse": {"a": 3}}})
    with pytest.raises(DataSpecError, match=r"schema\.dense = None: missing"):
        read_data_spec({"format": "parquet", "paths": "/p", "schema": {"sparse": {"a": 3}}})


def test_a_data_table_written_by_its_writer_reads_back_as_the_same_spec() -> None:
    """`DataSpec.to_dict` writes the `data` table a job's trainer config carries
    (`operators.lifecycle`); the trainer reads it as any other (`read_data_spec`)."""
    spec = read_data_spec({
        "format": "criteo_tsv", "paths": ["/d/day_*.tsv"], "max_bad_rows": 7,
        "schema": {"num_embeddings": 100, "sparse": {"cat_0": 10, "cat_1": {
            "num_embeddings": 20, "encoding": "vocabulary", "vocabulary": "/v/cat_1.txt"}}}})
    table = spec.to_dict()
    assert read_data_spec(table) == spec
    assert schema_from_dict(table["schema"]) == spec.schema
    assert table["schema"]["sparse"][1]["vocabulary"] == "/v/cat_1.txt"
    assert "vocabulary" not in table["schema"]["sparse"][0]


@pytest.mark.parametrize(("change", "says"), [
    ({"label": 3}, "label = 3: must be a string"),
    ({"dense": "a"}, "dense = 'a': must be a list"),
    ({"sparse": [{"name": "c", "column": "c", "num_embeddings": 0, "encoding": "hash"}]},
     "sparse[0].num_embeddings = 0: must be >= 1"),
    ({"sparse": [{"name": "c", "column": "c", "num_embeddings": 5, "encoding": "rot13"}]},
     "sparse[0].encoding = 'rot13': must be one of"),
])
def test_a_damaged_schema_table_names_the_field_and_value(change: dict[str, Any],
                                                          says: str) -> None:
    table = {"label": "label", "dense": ["a"],
             "sparse": [{"name": "c", "column": "c", "num_embeddings": 5, "encoding": "hash"}],
             **change}
    with pytest.raises(DataSpecError, match=f"manifest: schema: {re.escape(says)}"):
        schema_from_dict(table)
