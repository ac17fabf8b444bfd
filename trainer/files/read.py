"""Each format's reader: rows `[r0, r1)` of one file, as a checked `rows.Part`.

- Criteo TSV: the lines are found by the file's stride index (`check.index_tsv`) and
  read in one seek; pyarrow's CSV reader parses them (C++, typed), and when it refuses
  a value the lines are read again one by one (`_tsv_exact`), so that a bad row is named
  exactly and the good ones are kept. A file that lost rows since it was indexed fails
  its batch (`DataError`), never shifts the cursor.
- Parquet: the row groups that hold the rows, through pyarrow; a worker keeps the last
  `_GROUP_CACHE` decoded, since sequential batches read the same group.
- TorchRec's Criteo `.npy`: the three sibling arrays, memory-mapped, sliced.

Each worker keeps its open files in the source's `Caches`; every reader ends in
`rows.finish`, the checks and encodings all formats share.
"""

from __future__ import annotations

import io
import math
from typing import Final

import numpy as np

from airflow_ett.trainer.files.check import (
    MAX_LINE_BYTES,
    TSV_STRIDE,
    DataError,
    npy_map,
    npy_parts,
    open_data,
)
from airflow_ett.trainer.files.rows import Indexed, Part, RawFeature, finish

#: Row groups a worker keeps decoded (sequential batches read the same group).
_GROUP_CACHE: Final = 4


def read_part(source: Indexed, index: int, r0: int, r1: int) -> Part:
    """Rows `[r0, r1)` of file `index` of `source`, in its format."""
    if source.spec.format == "criteo_tsv":
        return _read_tsv(source, index, r0, r1)
    if source.spec.format == "parquet":
        return _read_parquet(source, index, r0, r1)
    return _read_npy(source, index, r0, r1)


def _tsv_lines(source: Indexed, index: int, r0: int, r1: int) -> list[bytes]:
    """Lines r0..r1 of a TSV file (without their newlines), by its stride index."""
    file = source.files[index]
    offsets = source.offsets[index]
    first = r0 // TSV_STRIDE
    begin = int(offsets[first])
    end_stride = (r1 - 1) // TSV_STRIDE + 1
    end = int(offsets[end_stride]) if end_stride < len(offsets) else None
    handles = source.caches.handles
    fh = handles.get(file)
    if fh is None:
        fh = open_data(file)  # kept open: every batch of this worker reads it
        handles[file] = fh
        if len(handles) > 8:
            handles.popitem(last=False)[1].close()
    fh.seek(begin)
    budget = (r1 - first * TSV_STRIDE + TSV_STRIDE) * MAX_LINE_BYTES
    data = fh.read(budget if end is None else min(end - begin, budget))
    lines = data.split(b"\n")
    skip = r0 - first * TSV_STRIDE
    out = lines[skip: skip + (r1 - r0)]
    if len(out) != r1 - r0:
        raise DataError(f"data file {file}: rows {r0 + 1}-{r1} are gone (the file changed "
                        "after it was indexed)")
    return [line[:-1] if line.endswith(b"\r") else line for line in out]


def _read_tsv(source: Indexed, index: int, r0: int, r1: int) -> Part:
    """pyarrow's CSV reader on the rows (C++, typed), or line by line when it refuses
    a value, so that a bad row is named exactly."""
    lines = _tsv_lines(source, index, r0, r1)
    try:
        return _tsv_fast(source, index, lines)
    except _Fallback:
        return _tsv_exact(source, index, lines)


class _Fallback(Exception):
    """pyarrow could not read the rows as typed: read them line by line instead."""


def _skip_row(_row: object) -> str:
    """A line of another column count: skipped here, so the row count falls short and
    the exact reader takes over (an exception raised here would only be printed)."""
    return "skip"


def _tsv_fast(source: Indexed, index: int, lines: list[bytes]) -> Part:
    import pyarrow as pa
    import pyarrow.csv as pacsv

    spec = source.spec
    s = spec.schema
    columns = list(spec.columns or ())
    types = {s.label: pa.float64(), **{d: pa.float64() for d in s.dense},
             **{f.column: pa.binary() for f in s.sparse}}
    try:
        table = pacsv.read_csv(
            io.BytesIO(b"\n".join(lines) + b"\n"),
            read_options=pacsv.ReadOptions(column_names=columns, use_threads=False,
                                           block_size=max(1 << 16, sum(map(len, lines)) + 64)),
            parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False,
                                             double_quote=False, escape_char=False,
                                             invalid_row_handler=_skip_row),
            convert_options=pacsv.ConvertOptions(column_types=types,
                                                 include_columns=list(types),
                                                 strings_can_be_null=False,
                                                 null_values=[""]))
    except pa.ArrowInvalid:
        raise _Fallback from None
    if table.num_rows != len(lines):  # a line skipped, or an empty one
        raise _Fallback
    label = table.column(s.label)
    label_null = np.asarray(label.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    labels = np.asarray(label.fill_null(0).to_numpy(), dtype=np.float64)
    dense = (np.stack([np.asarray(table.column(d).fill_null(0.0).to_numpy(), np.float64)
                       for d in s.dense], axis=1) if s.dense
             else np.zeros((len(lines), 0)))
    ones = np.ones(len(lines), dtype=np.int32)
    sparse = [(table.column(f.column).fill_null(b""), ones) for f in s.sparse]
    return finish(source, labels, label_null, dense, sparse, {})


def _tsv_exact(source: Indexed, index: int, lines: list[bytes]) -> Part:
    import pyarrow as pa

    spec = source.spec
    s = spec.schema
    columns = list(spec.columns or ())
    at = {c: i for i, c in enumerate(columns)}
    n = len(lines)
    bad: dict[int, str] = {}
    labels = np.zeros(n)
    dense = np.zeros((n, len(s.dense)))
    cats: list[list[bytes]] = [[b""] * n for _ in s.sparse]
    for row, line in enumerate(lines):
        cells = line.split(b"\t")
        if len(cells) != len(columns):
            bad[row] = (f"{len(cells)} columns, the schema has {len(columns)}" if line
                        else "an empty line")
            continue
        try:
            labels[row] = _number(cells[at[s.label]], s.label, empty_ok=False)
            for j, name in enumerate(s.dense):
                dense[row, j] = _number(cells[at[name]], name, empty_ok=True)
        except ValueError as exc:
            bad[row] = str(exc)
            continue
        for f, feature in enumerate(s.sparse):
            cats[f][row] = cells[at[feature.column]]
    ones = np.ones(n, dtype=np.int32)
    sparse = [(pa.array(c, type=pa.binary()), ones) for c in cats]
    return finish(source, labels, None, dense, sparse, bad)


def _number(cell: bytes, column: str, *, empty_ok: bool) -> float:
    if not cell:
        if empty_ok:
            return 0.0
        raise ValueError(f"column {column!r}: empty")
    try:
        value = float(cell)
    except ValueError:
        raise ValueError(f"column {column!r}: {cell[:40]!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"column {column!r}: {cell[:40]!r} is not a finite number")
    return value


def _read_parquet(source: Indexed, index: int, r0: int, r1: int) -> Part:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = source.files[index]
    s = source.spec.schema
    state = source.caches
    meta = state.parquet
    if file not in meta:
        pf = pq.ParquetFile(open_data(file))
        sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        meta[file] = (pf, np.cumsum((0, *sizes)))
    pf, bounds = meta[file]
    groups = state.groups
    needed = sorted({c for c in (s.label, *s.dense, *(f.column for f in s.sparse))})
    first = int(np.searchsorted(bounds, r0, side="right")) - 1
    last = int(np.searchsorted(bounds, r1 - 1, side="right")) - 1
    tables = []
    for g in range(first, last + 1):
        key = (file, g)
        if key not in groups:
            groups[key] = pf.read_row_group(g, columns=needed)
            if len(groups) > _GROUP_CACHE:
                groups.popitem(last=False)
        tables.append(groups[key])
    table = pa.concat_tables(tables).slice(r0 - int(bounds[first]), r1 - r0)
    label = table.column(s.label)
    label_null = np.asarray(label.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    labels = np.asarray(label.cast(pa.float64()).fill_null(0).to_numpy(), dtype=np.float64)
    dense = (np.stack([np.asarray(table.column(d).cast(pa.float64()).fill_null(0.0).to_numpy(),
                                  np.float64) for d in s.dense], axis=1)
             if s.dense else np.zeros((table.num_rows, 0)))
    sparse = []
    for f in s.sparse:
        col = table.column(f.column).combine_chunks()
        if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
            lengths = np.asarray(pc.list_value_length(col).fill_null(0).to_numpy(), np.int32)
            sparse.append((pc.list_flatten(col), lengths))
        else:
            if pa.types.is_string(col.type) or pa.types.is_binary(col.type) or \
                    pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type):
                col = col.cast(pa.binary()).fill_null(b"")
            sparse.append((col, np.ones(table.num_rows, dtype=np.int32)))
    return finish(source, labels, label_null, dense, sparse, {})


def _read_npy(source: Indexed, index: int, r0: int, r1: int) -> Part:
    import pyarrow as pa  # noqa: F401  # encode's import, paid once per worker

    from airflow_ett.trainer.schema import CRITEO_DENSE, CRITEO_SPARSE

    file = source.files[index]
    s = source.spec.schema
    arrays = source.caches.npy
    if file not in arrays:
        dense_f, sparse_f, labels_f = npy_parts(file)
        arrays[file] = (npy_map(dense_f), npy_map(sparse_f), npy_map(labels_f))
    dense_a, sparse_a, labels_a = arrays[file]
    dense_cols = [CRITEO_DENSE.index(d) for d in s.dense]
    dense = np.asarray(dense_a[r0:r1][:, dense_cols], dtype=np.float64)
    labels = np.asarray(labels_a[r0:r1, 0], dtype=np.float64)
    block = np.asarray(sparse_a[r0:r1], dtype=np.int64)
    ones = np.ones(r1 - r0, dtype=np.int32)
    sparse: list[RawFeature] = [
        (np.ascontiguousarray(block[:, CRITEO_SPARSE.index(f.column)]), ones)
        for f in s.sparse]
    return finish(source, labels, None, dense, sparse, {})


__all__ = ["read_part"]
