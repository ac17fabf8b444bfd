"""The owner's files as a pipeline `Source`: Criteo TSV, TorchRec's Criteo `.npy`, Parquet.

The data cursor stays the whole pipeline state: any batch is a pure function of the
cursor (`source.FileSource`), so any number of workers or ranks, and a restore at cursor
`c` reads exactly the rows a run that never stopped would have read from `c` on.

One job a module, each importing only those before it:

- `check`: finding the files and checking each against the schema, once, at `prepare`,
  indexing what random access needs (row counts, a TSV's line offsets); `DataError`.
- `rows`: what a reader hands back (`Part`), the checks and encodings every format
  shares, and what a reader needs of its source (`Indexed`, a Protocol).
- `read`: each format's reader of a row range.
- `source`: `FileSource` and `file_source`, the rows of a step turned into a batch.

A row that cannot be read (a missing column, a label that is not a number in [0, 1], a
dense value that is not a finite number, an id out of range, a list longer than its
`max_ids`) is left out of its batch and reported in it (`RawBatch.skipped`, `problems`
naming file, row and column); the trainer counts them against `data.max_bad_rows`. A
file that is missing, empty, not a regular file, or of another schema is a `DataError`
at `prepare`: one line naming it (the trainer exits 78).

Bounds (docs/security.md): regular files only; a TSV line is at most `MAX_LINE_BYTES`;
a vocabulary at most `MAX_VOCAB_BYTES`; `.npy` headers are read with numpy's own header
limit; Parquet footers and row groups with pyarrow's own limits.
"""

from __future__ import annotations

from airflow_ett.trainer.files.check import (
    MAX_LINE_BYTES,
    MAX_VOCAB_BYTES,
    TSV_STRIDE,
    DataError,
    find_files,
)
from airflow_ett.trainer.files.source import MAX_PROBLEMS, FileSource, file_source

__all__ = [
    "MAX_LINE_BYTES",
    "MAX_PROBLEMS",
    "MAX_VOCAB_BYTES",
    "TSV_STRIDE",
    "DataError",
    "FileSource",
    "file_source",
    "find_files",
]
