"""The owner's files as batches: the three formats agree with each other and with
TorchRec's own readers; the cursor is the whole state (any rank, worker or restart
reads the same rows); every kind of bad row is skipped, counted and named; every kind of
bad file is one `DataError` line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_ett.examples.make_data import NUM_EMBEDDINGS, make
from airflow_ett.trainer.data import DataPipeline
from airflow_ett.trainer.data_source import RawBatch
from airflow_ett.trainer.files import TSV_STRIDE, DataError, FileSource, file_source
from airflow_ett.trainer.schema import read_data_spec

ROWS = 1500  # two files of 750: batches cross a file boundary and the epoch's end


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("files")
    make(out, rows=ROWS, files=2, seed=11, npy=True)
    return out


def source(data: Path, fmt: str, batch: int = 64, **schema: Any) -> FileSource:
    sparse = {f"cat_{i}": NUM_EMBEDDINGS[i] for i in range(26)}
    spec: dict[str, Any] = {"format": fmt, "schema": {"sparse": sparse, **schema}}
    if fmt == "criteo_tsv":
        spec["paths"] = str(data / "day_*.tsv")
    elif fmt == "parquet":
        spec |= {"paths": str(data / "day_*.parquet"), "dense_transform": "log1p"}
        spec["schema"] |= {"dense": [f"int_{i}" for i in range(13)], "encoding": "hex"}
    else:
        spec["paths"] = str(data / "day_*_dense.npy")
    return file_source(read_data_spec(spec), batch).prepare()


def same(a: RawBatch, b: RawBatch, *, dense: bool = True) -> None:
    assert (a.cursor_start, a.cursor_end) == (b.cursor_start, b.cursor_end)
    assert np.array_equal(a.values, b.values) and np.array_equal(a.lengths, b.lengths)
    assert np.array_equal(a.labels, b.labels)
    if dense:
        assert np.array_equal(a.dense, b.dense)


def test_tsv_parquet_and_torchrecs_npy_give_the_same_ids_and_labels(data: Path) -> None:
    tsv, parquet, npy = (source(data, f) for f in ("criteo_tsv", "parquet", "criteo_npy"))
    assert tsv.rows == parquet.rows == npy.rows == (750, 750)
    for cursor in (0, 700, 1480):  # inside a file, across the boundary, across the end
        a, b, c = (s.rank_batch(cursor) for s in (tsv, parquet, npy))
        same(a, b)  # the same dense too: log1p of the same integers
        same(a, c, dense=False)  # TorchRec's .npy dense is its own transform of them
        assert a.dense.shape == (64, 13) and a.values.shape == (64 * 26,)
    # and what TorchRec's own reader reads from its .npy files, rows 700..764
    from torchrec.datasets.criteo import BinaryCriteoUtils

    first = BinaryCriteoUtils.load_npy_range(str(data / "day_0_sparse.npy"), 700, 50)
    second = BinaryCriteoUtils.load_npy_range(str(data / "day_1_sparse.npy"), 0, 14)
    ids = np.concatenate([first, second]) % np.asarray(NUM_EMBEDDINGS)
    batch = tsv.rank_batch(700)
    assert np.array_equal(batch.values.reshape(26, 64).T, ids)
    labels = np.concatenate([
        BinaryCriteoUtils.load_npy_range(str(data / "day_0_labels.npy"), 700, 50),
        BinaryCriteoUtils.load_npy_range(str(data / "day_1_labels.npy"), 0, 14)])
    assert np.array_equal(batch.labels, labels[:, 0].astype(np.float32))


@settings(max_examples=25, deadline=None)
@given(cursor=st.integers(0, 10 * ROWS), world=st.integers(1, 4), fmt=st.sampled_from(
    ["criteo_tsv", "parquet", "criteo_npy"]))
def test_a_rank_share_is_its_rows_of_the_global_step_wherever_read(
        data: Path, cursor: int, world: int, fmt: str) -> None:
    """Rank r of W at cursor c holds global rows [c + r*B, c + (r+1)*B) mod total: the
    same as one rank reading that range, whatever came before (a restore, a worker)."""
    one = source(data, fmt, batch=16)
    ranked = [one.rank_batch(cursor, r, world) for r in range(world)]
    for r, batch in enumerate(ranked):
        assert (batch.cursor_start, batch.cursor_end) == (cursor, cursor + world * 16)
        alone = one.rank_batch(cursor + r * 16)
        assert np.array_equal(batch.values, alone.values)
        assert np.array_equal(batch.labels, alone.labels)
    epoch_later = one.rank_batch(cursor + ROWS)
    assert np.array_equal(epoch_later.values, one.rank_batch(cursor).values)


def test_workers_and_a_restart_read_bitwise_the_same_batches(data: Path) -> None:
    spec = source(data, "criteo_tsv", batch=32)
    straight = DataPipeline(spec, start_cursor=0, num_workers=0)
    with straight:
        want = [straight.next_batch() for _ in range(40)]
    unprepared = file_source(spec.spec, 32)  # the pipeline's start indexes it
    with DataPipeline(unprepared, start_cursor=20 * 32, num_workers=2) as resumed:
        got = [resumed.next_batch(timeout=60) for _ in range(20)]
    for a, b in zip(want[20:], got, strict=True):
        assert a.cursor_start == b.cursor_start
        assert a.dense.equal(b.dense) and a.labels.equal(b.labels)
        assert a.sparse.values().equal(b.sparse.values())


def write_tsv(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows))
    return path


def tiny_tsv(tmp_path: Path, rows: list[str], **data: Any) -> FileSource:
    spec = {"format": "criteo_tsv", "paths": str(write_tsv(tmp_path / "part.tsv", rows)),
            "columns": ["label", "d", "c"], "schema": {"dense": ["d"], "sparse": {"c": 16}},
            **data}
    return file_source(read_data_spec(spec), len(rows)).prepare()


def test_each_kind_of_bad_row_is_skipped_counted_and_named(tmp_path: Path) -> None:
    rows = ["1\t3\t0a", "2\t3\t0a", "\t3\t0a", "1\tinf\t0a", "1\tx7\t0a", "0\t1", "",
            "0\t1\tzz", "0\t1\t" + "f" * 17, "0\t\t", "1\t4\t0b"]
    batch = tiny_tsv(tmp_path, rows).rank_batch(0)
    assert batch.skipped == 8 and batch.labels.tolist() == [1.0, 0.0, 1.0]
    assert batch.values.tolist() == [10, 0, 11]  # hex 0a, empty (TorchRec's "0"), 0b
    assert batch.dense[:, 0].tolist() == pytest.approx(np.log1p([3, 0, 4]).tolist())
    named = {p.split(": ", 1)[1] for p in batch.problems}
    assert len(batch.problems) == 3 and all("part.tsv row " in p for p in batch.problems)
    assert named == {"column 'label': label 2.0 is not a number in [0, 1]",
                     "column 'label': empty", "column 'd': b'inf' is not a finite number"}
    later = tiny_tsv(tmp_path, rows[4:]).rank_batch(0)
    assert [p.split(": ", 1)[1] for p in later.problems] == [
        "column 'd': b'x7' is not a number", "2 columns, the schema has 3", "an empty line"]
    last = tiny_tsv(tmp_path, rows[7:]).rank_batch(0)
    assert [p.split("row ")[1] for p in last.problems] == [
        "1: column 'c': a value that is not a hexadecimal id of at most 16 digits",
        "2: column 'c': a value that is not a hexadecimal id of at most 16 digits"]


def test_parquet_lists_nulls_ids_and_vocabularies(tmp_path: Path) -> None:
    table = pa.table({
        "y": pa.array([1, 0, None, 1, 0], type=pa.int8()),
        "age": pa.array([1.5, None, 2.0, 3.0, float("nan")]),
        "tags": pa.array([[1, 2], [], None, [3, 4, 5], [6]], type=pa.list_(pa.int64())),
        "user": pa.array([0, 9, 3, 10, 4]),
        "country": pa.array(["fr", "de", "xx", None, "fr"]),
    })
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=2)
    (tmp_path / "countries.txt").write_text("de\nfr\n")
    spec = read_data_spec({"format": "parquet", "paths": str(tmp_path / "p.parquet"),
                           "schema": {"label": "y", "dense": ["age"], "sparse": [
                               {"name": "tags", "num_embeddings": 100, "max_ids": 2},
                               {"name": "user", "num_embeddings": 10, "encoding": "id"},
                               {"name": "country", "num_embeddings": 3,
                                "encoding": "vocabulary", "vocabulary": "countries.txt"}]}},
                          base=tmp_path)
    batch = file_source(spec, 5).prepare().rank_batch(0)
    # row 3: no label; row 4: 3 tags > max_ids 2 and user 10 out of range; row 5: nan
    assert batch.skipped == 3 and batch.labels.tolist() == [1.0, 0.0]
    assert batch.lengths.tolist() == [2, 0, 1, 1, 1, 1]  # tags, user, country (key-major)
    assert batch.values.tolist()[2:] == [0, 9, 2, 1]  # users 0 and 9; fr -> 2, de -> 1
    assert batch.dense[:, 0].tolist() == [1.5, 0.0]
    assert [p.split("row ")[1] for p in batch.problems] == [
        "3: column 'y': no label", "4: column 'tags': 3 ids, more than max_ids = 2",
        "5: column 'age': nan is not a finite number"]


def refused(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(DataError) as caught:
        file_source(read_data_spec(spec), 8).prepare()
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_each_kind_of_bad_file_is_one_line(tmp_path: Path, data: Path) -> None:
    tsv = {"format": "criteo_tsv", "schema": {"num_embeddings": 8}}
    refused({**tsv, "paths": str(tmp_path / "none_*.tsv")}, "matches no file")
    refused({**tsv, "paths": str(tmp_path / "missing.tsv")}, "matches no file")
    (tmp_path / "empty.tsv").write_bytes(b"")
    refused({**tsv, "paths": str(tmp_path / "empty.tsv")}, "empty.tsv: empty (no rows)")
    write_tsv(tmp_path / "narrow.tsv", ["1\t2\t3"])
    refused({**tsv, "paths": str(tmp_path / "narrow.tsv")},
            "narrow.tsv row 1: 3 tab-separated columns, the schema's data.columns has 40")
    (tmp_path / "long.tsv").write_bytes(b"1\t" + b"a" * (2 << 20) + b"\n")
    refused({**tsv, "paths": str(tmp_path / "long.tsv")}, "long.tsv row 1: a line longer than")
    os.mkfifo(tmp_path / "fifo.tsv")
    refused({**tsv, "paths": str(tmp_path / "fifo.tsv")}, "fifo.tsv: not a regular file")
    (tmp_path / "dir.tsv").mkdir()
    refused({**tsv, "paths": str(tmp_path / "*.tsv")}, "not a regular file")
    pq.write_table(pa.table({"label": [1], "int_0": ["x"]}), tmp_path / "t.parquet")
    pq_spec = {"format": "parquet", "paths": str(tmp_path / "t.parquet"),
               "schema": {"dense": ["int_0"], "sparse": {"cat_0": 4}}}
    refused(pq_spec, "t.parquet: column 'int_0' (a dense feature) is string, not a number")
    refused({**pq_spec, "schema": {"dense": [], "sparse": {"cat_0": 4}}},
            "t.parquet: no column 'cat_0' (sparse feature 'cat_0')")
    (tmp_path / "junk.parquet").write_bytes(b"PAR1 not really")
    refused({**pq_spec, "paths": str(tmp_path / "junk.parquet")}, "not a readable Parquet")
    npy = {"format": "criteo_npy", "schema": {"num_embeddings": 8}}
    np.save(tmp_path / "a_dense.npy", np.zeros((4, 13), np.float32))
    refused({**npy, "paths": str(tmp_path / "a_dense.npy")}, "a_sparse.npy: missing")
    np.save(tmp_path / "a_sparse.npy", np.zeros((3, 26), np.int64))
    np.save(tmp_path / "a_labels.npy", np.zeros((4, 1), np.int32))
    refused({**npy, "paths": str(tmp_path / "a_dense.npy")}, "4 rows, but")
    np.save(tmp_path / "a_sparse.npy", np.zeros((4,), np.int64))
    refused({**npy, "paths": str(tmp_path / "a_dense.npy")}, "a_sparse.npy: shape (4,)")
    vocab = {"format": "criteo_tsv", "paths": str(data / "day_0.tsv"), "schema": {"sparse": {
        "cat_0": {"num_embeddings": 2, "encoding": "vocabulary",
                  "vocabulary": str(write_tsv(tmp_path / "v.txt", ["a", "b"]))}}}}
    refused(vocab, "2 values need num_embeddings >= 3")


def test_the_tsv_index_reaches_every_row_across_strides(tmp_path: Path) -> None:
    rows = [f"{i % 2}\t{i}\t{i:x}" for i in range(3 * TSV_STRIDE + 5)]
    src = tiny_tsv(tmp_path, rows)
    assert src.rows == (len(rows),) and len(src.offsets[0]) == 4
    one = file_source(src.spec, 7).prepare()
    for start in (0, TSV_STRIDE - 3, 2 * TSV_STRIDE, len(rows) - 2):
        got = one.rank_batch(start)
        want = [(start + k) % len(rows) for k in range(7)]
        assert got.values.tolist() == [w % 16 for w in want]
