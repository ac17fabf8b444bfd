"""The owner's files as a pipeline `Source`: Criteo TSV, TorchRec's Criteo `.npy`, Parquet.

The data cursor stays the whole pipeline state. The files the spec's patterns match,
sorted, are one sequence of rows; global sample `g` is row `g mod total` of it (the
cursor wraps into the next epoch at the end), and rank `r`'s share of the step at
cursor `c` is rows `[c + r*B, c + (r+1)*B)`, as with the generated log. So any batch is
a pure function of the cursor: any number of workers or ranks, and a restore at cursor
`c` reads exactly the rows a run that never stopped would have read from `c` on.

`prepare` (once, in the consumer, before the workers start) finds the files and checks
each against the schema, and indexes what random access needs: every file's row count,
and for a TSV the byte offset of every `TSV_STRIDE`-th line (one vectorised pass over
the bytes). Workers then read only the rows of their batches.

A row that cannot be read (a missing column, a label that is not a number in [0, 1], a
dense value that is not a finite number, an id out of range, a list longer than its
`max_ids`) is left out of its batch and reported in it (`RawBatch.skipped`,
`problems` naming file, row and column); the trainer counts them against
`data.max_bad_rows`. A file that is missing, empty, not a regular file, or of another
schema is a `DataError` at `prepare`: one line naming it (the trainer exits 78).

Bounds (docs/security.md): regular files only; a TSV line is at most `MAX_LINE_BYTES`;
a vocabulary at most `MAX_VOCAB_BYTES`; `.npy` headers are read with numpy's own header
limit; Parquet footers and row groups with pyarrow's own limits.
"""

from __future__ import annotations

import glob
import io
import math
import os
import stat
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, BinaryIO, Final

import numpy as np
import numpy.typing as npt

from airflow_ett._untrusted import UntrustedFileError, open_regular, read_bytes
from airflow_ett.trainer.data_gen import RawBatch
from airflow_ett.trainer.schema import DataSpec, SparseFeature

if TYPE_CHECKING:  # pyarrow loads in the workers that read Parquet or TSV
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_ett.trainer.encode import Column

#: Every this-many lines a TSV's index keeps the byte offset of the line's start: a read
#: of B rows reads at most B + 2 * TSV_STRIDE lines; the index costs 8 bytes per stride.
TSV_STRIDE: Final = 256
#: The longest TSV line read: a Criteo line is about 200 bytes.
MAX_LINE_BYTES: Final = 1 << 20
#: A vocabulary file: one value per line.
MAX_VOCAB_BYTES: Final = 256 << 20
#: Bad rows a batch describes in `problems` (all are counted).
MAX_PROBLEMS: Final = 3
_SCAN_CHUNK: Final = 16 << 20
#: Row groups a worker keeps decoded (sequential batches read the same group).
_GROUP_CACHE: Final = 4
_NPY_PARTS: Final = ("_dense.npy", "_sparse.npy", "_labels.npy")


class DataError(ValueError):
    """Data that cannot be trained on: one line naming the file (and row, column)."""


@dataclass(frozen=True, slots=True)
class _Part:
    """Rows `[r0, r1)` of one file, read: labels, dense [n, D], each feature's flat ids
    and per-row lengths, and for each bad row (index into the n rows) why."""

    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]
    bad: dict[int, str]


#: A `.npy` file's array, memory-mapped: of whichever dtype the file holds.
NpyArray = npt.NDArray[np.generic]
#: One feature's raw values of a part, before encoding, and each row's count of them.
RawFeature = tuple["Column", npt.NDArray[np.int32]]


@dataclass(slots=True)
class _Caches:
    """What one worker process keeps open or built between batches (never pickled: each
    process builds its own)."""

    vocab: dict[int, pa.Array] = field(default_factory=dict)  # per feature index
    handles: OrderedDict[str, BinaryIO] = field(default_factory=OrderedDict)  # TSV files
    parquet: dict[str, tuple[pq.ParquetFile, npt.NDArray[np.int64]]] = field(
        default_factory=dict)  # per file: the file and its row groups' first rows
    groups: OrderedDict[tuple[str, int], pa.Table] = field(default_factory=OrderedDict)
    npy: dict[str, tuple[NpyArray, NpyArray, NpyArray]] = field(default_factory=dict)


@dataclass(frozen=True)
class FileSource:
    """A `data_gen.Source` over the files of `spec` (module docstring)."""

    spec: DataSpec
    batch_size: int
    files: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    offsets: tuple[npt.NDArray[np.int64], ...] = ()  # TSV: line-start offsets per stride
    vocabularies: tuple[tuple[bytes, ...] | None, ...] = ()
    _state: _Caches = field(default_factory=_Caches, compare=False, repr=False)

    # -- the Source protocol -------------------------------------------------------------

    @property
    def feature_names(self) -> list[str]:
        return self.spec.schema.feature_names

    @property
    def num_dense(self) -> int:
        return self.spec.schema.num_dense

    @property
    def max_ids(self) -> tuple[int, ...]:
        return tuple(f.max_ids for f in self.spec.schema.sparse)

    @property
    def total_rows(self) -> int:
        return sum(self.rows)

    def __getstate__(self) -> dict[str, object]:  # the worker's caches stay in the worker
        return {"spec": self.spec, "batch_size": self.batch_size, "files": self.files,
                "rows": self.rows, "offsets": self.offsets,
                "vocabularies": self.vocabularies}

    def __setstate__(self, state: dict[str, object]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_state", _Caches())

    def prepare(self) -> FileSource:
        """Find, check and index the files (module docstring); `DataError` naming the
        first that cannot be used."""
        if self.files:
            return self
        files = find_files(self.spec)
        vocabularies = tuple(_vocabulary(f) if f.encoding == "vocabulary" else None
                             for f in self.spec.schema.sparse)
        rows: list[int] = []
        offsets: list[npt.NDArray[np.int64]] = []
        for file in files:
            if self.spec.format == "criteo_tsv":
                count, index = _index_tsv(file, self.spec)
                offsets.append(index)
            elif self.spec.format == "parquet":
                count = _check_parquet(file, self.spec)
            else:
                count = _check_npy(file, self.spec)
            if count == 0:
                raise DataError(f"data file {file}: empty (no rows)")
            rows.append(count)
        return replace(self, files=tuple(files), rows=tuple(rows), offsets=tuple(offsets),
                       vocabularies=vocabularies)

    def rank_batch(self, cursor: int, rank: int = 0, world_size: int = 1) -> RawBatch:
        """Rank `rank`'s rows of the step at global `cursor`, bad rows left out."""
        if not self.files:
            raise RuntimeError("FileSource.rank_batch before prepare()")
        b = self.batch_size
        parts = [(self._read(i, r0, r1), i, r0) for i, r0, r1 in
                 self._segments(cursor + rank * b, b)]
        return self._assemble(cursor, cursor + world_size * b, parts)

    # -- rows to batches -----------------------------------------------------------------

    def _segments(self, start: int, count: int) -> list[tuple[int, int, int]]:
        """(file index, first row, end row) covering global rows [start, start+count),
        wrapping at the end of the last file."""
        total = self.total_rows
        bounds = np.cumsum((0, *self.rows))
        out: list[tuple[int, int, int]] = []
        pos, left = start % total, count
        while left > 0:
            i = int(np.searchsorted(bounds, pos, side="right")) - 1
            r0 = pos - int(bounds[i])
            n = min(left, self.rows[i] - r0)
            out.append((i, r0, r0 + n))
            left -= n
            pos = (pos + n) % total
        return out

    def _assemble(self, start: int, end: int, parts: list[tuple[_Part, int, int]]) -> RawBatch:
        """One rank's batch from its parts, bad rows left out (and described)."""
        keep = []
        problems: list[str] = []
        skipped = 0
        for part, file, r0 in parts:
            mask = np.ones(len(part.labels), dtype=bool)
            mask[list(part.bad)] = False
            keep.append(mask)
            skipped += len(part.bad)
            for row, why in sorted(part.bad.items())[:MAX_PROBLEMS - len(problems)]:
                problems.append(f"data file {self.files[file]} row {r0 + row + 1}: {why}")
        values: list[npt.NDArray[np.int64]] = []
        lengths: list[npt.NDArray[np.int32]] = []
        for f in range(len(self.spec.schema.sparse)):  # key-major: feature f, every part
            for (part, _, _), mask in zip(parts, keep, strict=True):
                ids, lens = part.sparse[f]
                values.append(ids if mask.all() else ids[np.repeat(mask, lens)])
                lengths.append(lens[mask])
        return RawBatch(
            cursor_start=start,
            cursor_end=end,
            dense=np.ascontiguousarray(np.concatenate(
                [p.dense[m] for (p, _, _), m in zip(parts, keep, strict=True)])),
            values=np.concatenate(values).astype(np.int64, copy=False),
            lengths=np.concatenate(lengths).astype(np.int32, copy=False),
            labels=np.concatenate([p.labels[m] for (p, _, _), m in zip(parts, keep,
                                                                       strict=True)]),
            skipped=skipped,
            problems=tuple(problems),
        )

    def _read(self, index: int, r0: int, r1: int) -> _Part:
        if self.spec.format == "criteo_tsv":
            return _read_tsv(self, index, r0, r1)
        if self.spec.format == "parquet":
            return _read_parquet(self, index, r0, r1)
        return _read_npy(self, index, r0, r1)

    def vocabulary(self, f: int) -> pa.Array:
        """Feature `f`'s vocabulary as a pyarrow array (built once per process)."""
        import pyarrow as pa

        cache = self._state.vocab
        if f not in cache:
            cache[f] = pa.array(self.vocabularies[f], type=pa.binary())
        return cache[f]


# -- finding and checking files --------------------------------------------------------------


def _open_data(path: str) -> BinaryIO:
    """`path` opened for binary reading only if it is (still) a regular file: a FIFO put
    in its place after `prepare` would make a plain `open` wait for a writer forever."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise DataError(f"data file {path}: cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataError(f"data file {path}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def find_files(spec: DataSpec) -> list[str]:
    """The files the patterns match, sorted and without repeats; a pattern matching
    nothing, or matching something that is not a regular file, is a `DataError`."""
    from airflow_ett.trainer.schema import MAX_FILES

    found: set[str] = set()
    for pattern in spec.paths:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else (
            [pattern] if os.path.lexists(pattern) else [])
        if not matches:
            raise DataError(f"data: paths {pattern!r} matches no file")
        for match in matches:
            try:
                mode = os.stat(match).st_mode
            except OSError as exc:
                raise DataError(f"data file {match}: cannot be read: "
                                f"{exc.strerror or exc}") from None
            if not stat.S_ISREG(mode):
                raise DataError(f"data file {match}: not a regular file")
            found.add(os.path.abspath(match))
        if len(found) > MAX_FILES:
            raise DataError(f"data: paths match more than {MAX_FILES} files")
    return sorted(found)


def _vocabulary(feature: SparseFeature) -> tuple[bytes, ...]:
    assert feature.vocabulary is not None
    try:
        data = read_bytes(feature.vocabulary, what=f"vocabulary of {feature.name!r}",
                          max_bytes=MAX_VOCAB_BYTES)
    except UntrustedFileError as exc:
        raise DataError(str(exc)) from None
    values = tuple(line.rstrip(b"\r") for line in data.split(b"\n") if line.rstrip(b"\r"))
    if len(values) + 1 > feature.num_embeddings:
        raise DataError(f"vocabulary of {feature.name!r} ({feature.vocabulary}): {len(values)} "
                        f"values need num_embeddings >= {len(values) + 1} (0 is the "
                        f"out-of-vocabulary row), the schema says {feature.num_embeddings}")
    return values


def _index_tsv(file: str, spec: DataSpec) -> tuple[int, npt.NDArray[np.int64]]:
    """(rows, offsets of every TSV_STRIDE-th line start) in one bounded pass; the first
    line's column count must be the schema's."""
    starts: list[npt.NDArray[np.int64]] = [np.zeros(1, dtype=np.int64)]
    lines = 0  # newlines seen
    last_nl = -1
    size = 0
    first_line = b""
    try:
        with open_regular(file, what="data file") as fh:
            base = 0
            while chunk := fh.read(_SCAN_CHUNK):
                if base == 0:
                    first_line = chunk.split(b"\n", 1)[0]
                arr = np.frombuffer(chunk, dtype=np.uint8)
                nl = np.flatnonzero(arr == 10).astype(np.int64) + base
                if len(nl):
                    gaps = np.diff(nl, prepend=last_nl)
                    if int(gaps.max()) > MAX_LINE_BYTES:
                        row = lines + int(np.argmax(gaps)) + 1
                        raise DataError(f"data file {file} row {row}: a line longer than "
                                        f"{MAX_LINE_BYTES:,} bytes: not {spec.format} data")
                    numbers = lines + 1 + np.arange(len(nl), dtype=np.int64)
                    keep = numbers % TSV_STRIDE == 0
                    starts.append(nl[keep] + 1)
                    lines += len(nl)
                    last_nl = int(nl[-1])
                base += len(chunk)
                if base - last_nl - 1 > MAX_LINE_BYTES:
                    raise DataError(f"data file {file} row {lines + 1}: a line longer than "
                                    f"{MAX_LINE_BYTES:,} bytes: not {spec.format} data")
            size = base
    except UntrustedFileError as exc:
        raise DataError(str(exc)) from None
    rows = lines + (1 if size > last_nl + 1 else 0)
    columns = spec.columns or ()
    found = len(first_line.rstrip(b"\r").split(b"\t"))
    if size and found != len(columns):
        raise DataError(f"data file {file} row 1: {found} "
                        f"tab-separated columns, the schema's data.columns has "
                        f"{len(columns)}: not this data")
    offsets = np.concatenate(starts)
    return rows, offsets[offsets < size] if size else offsets[:0]


def _check_parquet(file: str, spec: DataSpec) -> int:
    """Rows of a Parquet file whose columns the schema can read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with _open_data(file) as fh:
            meta = pq.ParquetFile(fh)
            schema, rows = meta.schema_arrow, int(meta.metadata.num_rows)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"data file {file}: not a readable Parquet file: {exc}") from None
    s = spec.schema

    def column(name: str, what: str) -> pa.DataType:
        if schema.get_field_index(name) < 0:
            raise DataError(f"data file {file}: no column {name!r} ({what}); it has "
                            f"{schema.names[:20]}")
        return schema.field(name).type

    def numeric(t: pa.DataType) -> bool:
        return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))

    for name, what in ((s.label, "the label"), *((d, "a dense feature") for d in s.dense)):
        kind = column(name, what)
        if not numeric(kind):
            raise DataError(f"data file {file}: column {name!r} ({what}) is {kind}, not a "
                            "number")
    for f in s.sparse:
        kind = column(f.column, f"sparse feature {f.name!r}")
        item = kind.value_type if pa.types.is_list(kind) or pa.types.is_large_list(kind) \
            else kind
        text = pa.types.is_string(item) or pa.types.is_binary(item) or \
            pa.types.is_large_string(item) or pa.types.is_large_binary(item)
        if not (text or pa.types.is_integer(item)):
            raise DataError(f"data file {file}: column {f.column!r} (sparse feature "
                            f"{f.name!r}) is {kind}: ids come from strings or integers")
        if f.encoding == "hex" and not text:
            raise DataError(f"data file {file}: column {f.column!r} is {kind}: encoding "
                            "'hex' reads strings")
    return rows


def _npy_shape(path: str) -> tuple[tuple[int, ...], np.dtype[np.generic]]:
    """Shape and dtype of a `.npy` file from its header (TorchRec's
    `BinaryCriteoUtils.get_shape_from_npy`, bounded and without iopath)."""
    try:
        with open_regular(path, what="data file") as fh:
            version = np.lib.format.read_magic(fh)
            shape, fortran, dtype = (np.lib.format.read_array_header_1_0(fh)
                                     if version == (1, 0) else
                                     np.lib.format.read_array_header_2_0(fh))
    except UntrustedFileError as exc:
        raise DataError(str(exc)) from None
    except (ValueError, OSError) as exc:
        raise DataError(f"data file {path}: not a .npy file: {exc}") from None
    if fortran or len(shape) != 2:
        raise DataError(f"data file {path}: shape {shape}{' (Fortran order)' if fortran else ''}"
                        ": TorchRec's Criteo .npy arrays are 2-D, C order")
    return shape, dtype


def _npy_map(path: str) -> NpyArray:
    """The array of a `.npy` file, memory-mapped (never unpickled), from an opened
    regular file (numpy's `np.load(mmap_mode=...)` wants a path and opens it blindly)."""
    with _open_data(path) as fh:
        version = np.lib.format.read_magic(fh)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(fh) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(fh))
        return np.memmap(fh, dtype=dtype, mode="r", offset=fh.tell(), shape=shape,
                         order="F" if fortran else "C")


def _npy_parts(dense_file: str) -> tuple[str, str, str]:
    stem = dense_file[: -len(_NPY_PARTS[0])]
    return stem + _NPY_PARTS[0], stem + _NPY_PARTS[1], stem + _NPY_PARTS[2]


def _check_npy(file: str, spec: DataSpec) -> int:
    from airflow_ett.trainer.schema import CRITEO_DENSE, CRITEO_SPARSE

    dense_f, sparse_f, labels_f = _npy_parts(file)
    for part in (sparse_f, labels_f):
        if not os.path.isfile(part):
            raise DataError(f"data file {part}: missing (the sibling of {file})")
    (n, width), dtype = _npy_shape(dense_f)
    (ns, swidth), sdtype = _npy_shape(sparse_f)
    (nl, lwidth), ldtype = _npy_shape(labels_f)
    if not (n == ns == nl):
        raise DataError(f"data file {file}: {n} rows, but {sparse_f} has {ns} and {labels_f} "
                        f"has {nl}")
    need_dense = max((CRITEO_DENSE.index(d) for d in spec.schema.dense), default=-1) + 1
    need_sparse = max(CRITEO_SPARSE.index(f.column) for f in spec.schema.sparse) + 1
    if width < need_dense or not np.issubdtype(dtype, np.number):
        raise DataError(f"data file {dense_f}: {width} dense columns of {dtype}, the schema "
                        f"reads {need_dense}")
    if swidth < need_sparse or not np.issubdtype(sdtype, np.integer):
        raise DataError(f"data file {sparse_f}: {swidth} sparse columns of {sdtype}, the "
                        f"schema reads {need_sparse} integer columns")
    if lwidth != 1 or not np.issubdtype(ldtype, np.number):
        raise DataError(f"data file {labels_f}: shape ({nl}, {lwidth}) of {ldtype}: labels "
                        "are one number per row")
    return int(n)


# -- reading rows ------------------------------------------------------------------------------


def _finish(source: FileSource, labels: npt.NDArray[np.float64],
            label_null: npt.NDArray[np.bool_] | None, dense: npt.NDArray[np.float64],
            sparse_raw: list[RawFeature], bad: dict[int, str]) -> _Part:
    """Checks and encodings common to every format, on n rows already split in columns:
    `sparse_raw[f]` is (flat values, per-row lengths) of feature f before encoding."""
    s = source.spec.schema
    labels = np.asarray(labels, dtype=np.float64)
    wrong = ~np.isfinite(labels) | (labels < 0) | (labels > 1)
    for row in np.flatnonzero(wrong):
        value = float(labels[row])
        bad.setdefault(int(row), f"column {s.label!r}: label {value!r} is not a number in "
                                 "[0, 1]")
    if label_null is not None:
        for row in np.flatnonzero(label_null):
            bad.setdefault(int(row), f"column {s.label!r}: no label")
    if dense.size:
        nonfinite = ~np.isfinite(dense)
        for row, col in zip(*np.nonzero(nonfinite), strict=True):
            value = float(dense[row, col])
            bad.setdefault(int(row), f"column {s.dense[col]!r}: {value!r} is not a finite "
                                     "number")
        dense = np.where(nonfinite, 0.0, dense)
        if source.spec.dense_transform == "log1p":
            dense = np.log1p(np.maximum(dense, 0.0))
    sparse = _encoded(source, sparse_raw, bad)
    return _Part(labels.astype(np.float32), dense.astype(np.float32), sparse, bad)


def _encoded(source: FileSource, sparse_raw: list[RawFeature], bad: dict[int, str]
             ) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]:
    """Each feature's ids and per-row lengths; rows with a value it cannot encode, or
    more ids than `max_ids`, go to `bad`."""
    from airflow_ett.trainer.encode import encode_columns

    features = source.spec.schema.sparse
    vocabularies = {f: source.vocabulary(f) for f, feature in enumerate(features)
                    if feature.encoding == "vocabulary"}
    encoded = encode_columns([(values, feature) for (values, _), feature in
                              zip(sparse_raw, features, strict=True)], vocabularies)
    out = []
    for (ids, wrong), (_, lengths), feature in zip(encoded, sparse_raw, features, strict=True):
        lengths = np.asarray(lengths, dtype=np.int32)
        if wrong.any():
            owner = np.repeat(np.arange(len(lengths)), lengths)
            for row in np.unique(owner[wrong]):
                bad.setdefault(int(row), f"column {feature.column!r}: a value that is not "
                                         f"{_ENCODED[feature.encoding]}")
        for row in np.flatnonzero(lengths > feature.max_ids):
            bad.setdefault(int(row), f"column {feature.column!r}: {int(lengths[row])} ids, "
                                     f"more than max_ids = {feature.max_ids}")
        out.append((ids, lengths))
    return out


_ENCODED: Final = {"hash": "hashable", "hex": "a hexadecimal id of at most 16 digits",
                   "modulo": "an integer >= 0", "id": "a row id below num_embeddings",
                   "vocabulary": "a vocabulary value"}


def _tsv_lines(source: FileSource, index: int, r0: int, r1: int) -> list[bytes]:
    """Lines r0..r1 of a TSV file (without their newlines), by its stride index."""
    file = source.files[index]
    offsets = source.offsets[index]
    first = r0 // TSV_STRIDE
    begin = int(offsets[first])
    end_stride = (r1 - 1) // TSV_STRIDE + 1
    end = int(offsets[end_stride]) if end_stride < len(offsets) else None
    handles = source._state.handles
    fh = handles.get(file)
    if fh is None:
        fh = _open_data(file)  # kept open: every batch of this worker reads it
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


def _read_tsv(source: FileSource, index: int, r0: int, r1: int) -> _Part:
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


def _tsv_fast(source: FileSource, index: int, lines: list[bytes]) -> _Part:
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
    return _finish(source, labels, label_null, dense, sparse, {})


def _tsv_exact(source: FileSource, index: int, lines: list[bytes]) -> _Part:
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
    return _finish(source, labels, None, dense, sparse, bad)


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


def _read_parquet(source: FileSource, index: int, r0: int, r1: int) -> _Part:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = source.files[index]
    s = source.spec.schema
    state = source._state
    meta = state.parquet
    if file not in meta:
        pf = pq.ParquetFile(_open_data(file))
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
    return _finish(source, labels, label_null, dense, sparse, {})


def _read_npy(source: FileSource, index: int, r0: int, r1: int) -> _Part:
    import pyarrow as pa  # noqa: F401  # encode's import, paid once per worker

    from airflow_ett.trainer.schema import CRITEO_DENSE, CRITEO_SPARSE

    file = source.files[index]
    s = source.spec.schema
    arrays = source._state.npy
    if file not in arrays:
        dense_f, sparse_f, labels_f = _npy_parts(file)
        arrays[file] = (_npy_map(dense_f), _npy_map(sparse_f), _npy_map(labels_f))
    dense_a, sparse_a, labels_a = arrays[file]
    dense_cols = [CRITEO_DENSE.index(d) for d in s.dense]
    dense = np.asarray(dense_a[r0:r1][:, dense_cols], dtype=np.float64)
    labels = np.asarray(labels_a[r0:r1, 0], dtype=np.float64)
    block = np.asarray(sparse_a[r0:r1], dtype=np.int64)
    ones = np.ones(r1 - r0, dtype=np.int32)
    sparse: list[RawFeature] = [
        (np.ascontiguousarray(block[:, CRITEO_SPARSE.index(f.column)]), ones)
        for f in s.sparse]
    return _finish(source, labels, None, dense, sparse, {})


def file_source(spec: DataSpec, batch_size: int) -> FileSource:
    """An unprepared source (cheap: nothing is opened until `prepare`)."""
    return FileSource(spec, batch_size)


__all__ = ["DataError", "FileSource", "file_source", "find_files"]
