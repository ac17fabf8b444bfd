"""Finding, opening and checking the owner's files, once, before any row is read.

`find_files` turns the spec's patterns into a sorted list of regular files; the checks
(`index_tsv`, `check_parquet`, `check_npy`, `read_vocabulary`) read each file's header
or bytes and either return what random access needs (its row count; for a TSV the byte
offset of every `TSV_STRIDE`-th line, found in one vectorised pass) or raise a
`DataError`: one line naming the file, which the trainer turns into exit code 78.

Every file is opened as untrusted input (docs/security.md): regular files only
(`open_data` refuses a FIFO put in a file's place after it was found, which a plain
`open` would wait on forever), a TSV line at most `MAX_LINE_BYTES`, a vocabulary at most
`MAX_VOCAB_BYTES`, `.npy` headers through numpy's own bounded reader and arrays only
memory-mapped, never unpickled (`npy_map`), Parquet footers through pyarrow's limits.
"""

from __future__ import annotations

import glob
import os
import stat
from typing import BinaryIO, Final

import numpy as np
import numpy.typing as npt

from airflow_ett._untrusted import UntrustedFileError, open_regular, read_bytes
from airflow_ett.trainer.schema import DataSpec, SparseFeature

#: Every this-many lines a TSV's index keeps the byte offset of the line's start: a read
#: of B rows reads at most B + 2 * TSV_STRIDE lines; the index costs 8 bytes per stride.
TSV_STRIDE: Final = 256
#: The longest TSV line read: a Criteo line is about 200 bytes.
MAX_LINE_BYTES: Final = 1 << 20
#: A vocabulary file: one value per line.
MAX_VOCAB_BYTES: Final = 256 << 20
_SCAN_CHUNK: Final = 16 << 20
_NPY_PARTS: Final = ("_dense.npy", "_sparse.npy", "_labels.npy")


class DataError(ValueError):
    """Data that cannot be trained on: one line naming the file (and row, column)."""


#: A `.npy` file's array, memory-mapped: of whichever dtype the file holds.
NpyArray = npt.NDArray[np.generic]


def open_data(path: str) -> BinaryIO:
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


def read_vocabulary(feature: SparseFeature) -> tuple[bytes, ...]:
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


def index_tsv(file: str, spec: DataSpec) -> tuple[int, npt.NDArray[np.int64]]:
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


def check_parquet(file: str, spec: DataSpec) -> int:
    """Rows of a Parquet file whose columns the schema can read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open_data(file) as fh:
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


def npy_shape(path: str) -> tuple[tuple[int, ...], np.dtype[np.generic]]:
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


def npy_map(path: str) -> NpyArray:
    """The array of a `.npy` file, memory-mapped (never unpickled), from an opened
    regular file (numpy's `np.load(mmap_mode=...)` wants a path and opens it blindly)."""
    with open_data(path) as fh:
        version = np.lib.format.read_magic(fh)
        shape, fortran, dtype = (np.lib.format.read_array_header_1_0(fh) if version == (1, 0)
                                 else np.lib.format.read_array_header_2_0(fh))
        return np.memmap(fh, dtype=dtype, mode="r", offset=fh.tell(), shape=shape,
                         order="F" if fortran else "C")


def npy_parts(dense_file: str) -> tuple[str, str, str]:
    stem = dense_file[: -len(_NPY_PARTS[0])]
    return stem + _NPY_PARTS[0], stem + _NPY_PARTS[1], stem + _NPY_PARTS[2]


def check_npy(file: str, spec: DataSpec) -> int:
    from airflow_ett.trainer.schema import CRITEO_DENSE, CRITEO_SPARSE

    dense_f, sparse_f, labels_f = npy_parts(file)
    for part in (sparse_f, labels_f):
        if not os.path.isfile(part):
            raise DataError(f"data file {part}: missing (the sibling of {file})")
    (n, width), dtype = npy_shape(dense_f)
    (ns, swidth), sdtype = npy_shape(sparse_f)
    (nl, lwidth), ldtype = npy_shape(labels_f)
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


__all__ = [
    "MAX_LINE_BYTES",
    "MAX_VOCAB_BYTES",
    "TSV_STRIDE",
    "DataError",
    "NpyArray",
    "check_npy",
    "check_parquet",
    "find_files",
    "index_tsv",
    "npy_map",
    "npy_parts",
    "npy_shape",
    "open_data",
    "read_vocabulary",
]
