"""`FileSource`: the owner's files as a pipeline `Source`, its batches a function of the
cursor.

The files the spec's patterns match, sorted, are one sequence of rows; global sample `g`
is row `g mod total` of it (the cursor wraps into the next epoch at the end), and rank
`r`'s share of the step at cursor `c` is rows `[c + r*B, c + (r+1)*B)`, as with the
generated log. `prepare` (once, in the consumer) finds, checks and indexes the files
(`check`); `rank_batch` splits the rank's rows into per-file segments, has each read
(`read`) and assembles the batch, bad rows left out and described (`RawBatch.skipped`,
at most `MAX_PROBLEMS` named in `problems`). Pickled into each spawned worker, it
carries the index but never the worker's open files (`rows.Caches`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Final

import numpy as np
import numpy.typing as npt

from airflow_ett.trainer.data_source import RawBatch
from airflow_ett.trainer.files.check import (
    DataError,
    check_npy,
    check_parquet,
    find_files,
    index_tsv,
    read_vocabulary,
)
from airflow_ett.trainer.files.read import read_part
from airflow_ett.trainer.files.rows import Caches, Part
from airflow_ett.trainer.schema import DataSpec

if TYPE_CHECKING:  # pyarrow loads in the workers that read Parquet or TSV
    import pyarrow as pa

#: Bad rows a batch describes in `problems` (all are counted).
MAX_PROBLEMS: Final = 3


@dataclass(frozen=True)
class FileSource:
    """A `data_source.Source` over the files of `spec` (module docstring)."""

    spec: DataSpec
    batch_size: int
    files: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    offsets: tuple[npt.NDArray[np.int64], ...] = ()  # TSV: line-start offsets per stride
    vocabularies: tuple[tuple[bytes, ...] | None, ...] = ()
    _state: Caches = field(default_factory=Caches, compare=False, repr=False)

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
        object.__setattr__(self, "_state", Caches())

    def prepare(self) -> FileSource:
        """Find, check and index the files (module docstring); `DataError` naming the
        first that cannot be used."""
        if self.files:
            return self
        files = find_files(self.spec)
        vocabularies = tuple(read_vocabulary(f) if f.encoding == "vocabulary" else None
                             for f in self.spec.schema.sparse)
        rows: list[int] = []
        offsets: list[npt.NDArray[np.int64]] = []
        for file in files:
            if self.spec.format == "criteo_tsv":
                count, index = index_tsv(file, self.spec)
                offsets.append(index)
            elif self.spec.format == "parquet":
                count = check_parquet(file, self.spec)
            else:
                count = check_npy(file, self.spec)
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
        parts = [(read_part(self, i, r0, r1), i, r0) for i, r0, r1 in
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

    def _assemble(self, start: int, end: int, parts: list[tuple[Part, int, int]]) -> RawBatch:
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

    @property
    def caches(self) -> Caches:
        """What this worker process keeps open between batches (`read`'s)."""
        return self._state

    def vocabulary(self, f: int) -> pa.Array:
        """Feature `f`'s vocabulary as a pyarrow array (built once per process)."""
        import pyarrow as pa

        cache = self._state.vocab
        if f not in cache:
            cache[f] = pa.array(self.vocabularies[f], type=pa.binary())
        return cache[f]


def file_source(spec: DataSpec, batch_size: int) -> FileSource:
    """An unprepared source (cheap: nothing is opened until `prepare`)."""
    return FileSource(spec, batch_size)


__all__ = ["MAX_PROBLEMS", "FileSource", "file_source"]
