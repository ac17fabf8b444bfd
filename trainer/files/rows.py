"""What every format's reader hands back, and the checks and encodings common to them.

A reader (`read`) turns rows `[r0, r1)` of one file into columns; `finish` then checks
them the same way whatever the format and encodes the ids (`encode.encode_columns`),
giving a `Part`: labels, dense values, each feature's ids with per-row lengths, and for
each bad row why (a label not a number in [0, 1], a dense value not finite, an id that
cannot be encoded, more ids than `max_ids`). Bad rows stay in the part, named; the
source leaves them out of the batch and counts them.

The readers take an `Indexed` (what they need of `source.FileSource`: its spec, files,
TSV offsets, the worker's `Caches` and the vocabularies) rather than the class itself,
so that nothing here imports the source back. `Caches` is what one worker process keeps
open between batches; it is never pickled, each process builds its own.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Final, Protocol

import numpy as np
import numpy.typing as npt

from airflow_ett.trainer.files.check import NpyArray
from airflow_ett.trainer.schema import DataSpec

if TYPE_CHECKING:  # pyarrow loads in the workers that read Parquet or TSV
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_ett.trainer.encode import Column


@dataclass(frozen=True, slots=True)
class Part:
    """Rows `[r0, r1)` of one file, read: labels, dense [n, D], each feature's flat ids
    and per-row lengths, and for each bad row (index into the n rows) why."""

    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int32]]]
    bad: dict[int, str]


#: One feature's raw values of a part, before encoding, and each row's count of them.
RawFeature = tuple["Column", npt.NDArray[np.int32]]


@dataclass(slots=True)
class Caches:
    """What one worker process keeps open or built between batches (never pickled: each
    process builds its own)."""

    vocab: dict[int, pa.Array] = field(default_factory=dict)  # per feature index
    handles: OrderedDict[str, BinaryIO] = field(default_factory=OrderedDict)  # TSV files
    parquet: dict[str, tuple[pq.ParquetFile, npt.NDArray[np.int64]]] = field(
        default_factory=dict)  # per file: the file and its row groups' first rows
    groups: OrderedDict[tuple[str, int], pa.Table] = field(default_factory=OrderedDict)
    npy: dict[str, tuple[NpyArray, NpyArray, NpyArray]] = field(default_factory=dict)


class Indexed(Protocol):
    """What the readers need of a prepared source (`source.FileSource`)."""

    @property
    def spec(self) -> DataSpec: ...

    @property
    def files(self) -> tuple[str, ...]: ...

    @property
    def offsets(self) -> tuple[npt.NDArray[np.int64], ...]: ...  # TSV: per stride

    @property
    def caches(self) -> Caches: ...

    def vocabulary(self, f: int) -> pa.Array: ...


def finish(source: Indexed, labels: npt.NDArray[np.float64],
           label_null: npt.NDArray[np.bool_] | None, dense: npt.NDArray[np.float64],
           sparse_raw: list[RawFeature], bad: dict[int, str]) -> Part:
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
    return Part(labels.astype(np.float32), dense.astype(np.float32), sparse, bad)


def _encoded(source: Indexed, sparse_raw: list[RawFeature], bad: dict[int, str]
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



__all__ = ["Caches", "Indexed", "Part", "RawFeature", "finish"]
