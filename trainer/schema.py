"""What the training data is: its format, its files and the schema its owner declares.

Torch-free and numpy-free: a DAG file validates a job's `data` when Airflow parses it.
The files themselves are read by `trainer/files.py` (in the data workers); this module
only says what they must hold:

- `format`: `synthetic` (the generated click log of `data_gen.py`), `criteo_tsv` (the
  Criteo click-log layout TorchRec's `torchrec.datasets.criteo` reads: no header, tab
  separated, label then dense then categorical columns), `criteo_npy` (TorchRec's
  preprocessed form, `BinaryCriteoUtils.tsv_to_npys`: `<stem>_dense.npy`,
  `<stem>_sparse.npy`, `<stem>_labels.npy`) or `parquet` (pyarrow).
- `paths`: file paths or glob patterns; the files they match, sorted, are the data, read
  in that order. The global sample cursor maps to (file, row) across them and wraps
  around at the end (the next epoch), so a restore resumes on exactly the next sample.
- `schema`: which column is the label, which are dense features, and the sparse
  features: each a KeyedJaggedTensor key with its column, its table size
  (`num_embeddings`) and how a raw value becomes a row id (`encoding`).
- `max_bad_rows`: rows that cannot be read (a missing column, a label that is not 0/1, a
  value that is not a number) are skipped and counted, at most this many per job; the
  cursor still counts them (a skip never shifts which sample comes next).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, NotRequired, TypedDict

from airflow_ett.trainer.readers import Reader, show

Format = Literal["synthetic", "criteo_tsv", "criteo_npy", "parquet"]
FORMATS: Final[tuple[Format, ...]] = ("synthetic", "criteo_tsv", "criteo_npy", "parquet")
Encoding = Literal["hash", "hex", "modulo", "id", "vocabulary"]
#: How a raw categorical value becomes a row id in `[0, num_embeddings)`:
#: `hash`: a stable 64-bit hash of the value (bytes of a string, the value of an integer)
#: modulo the table size; `hex`: a hexadecimal string read as an integer, modulo the size
#: (TorchRec's Criteo convention: `int(v or "0", 16) % hashes`); `modulo`: an integer
#: modulo the size (what TorchRec applies to the `.npy` form); `id`: an integer that
#: must already be a row id (out of range: a bad row); `vocabulary`: the value's line
#: number (1-based) in a vocabulary file, 0 for a value not in it.
ENCODINGS: Final[tuple[Encoding, ...]] = ("hash", "hex", "modulo", "id", "vocabulary")
DenseTransform = Literal["none", "log1p"]
DENSE_TRANSFORMS: Final[tuple[DenseTransform, ...]] = ("none", "log1p")

#: TorchRec's Criteo column names (`torchrec.datasets.criteo.DEFAULT_COLUMN_NAMES`),
#: written out so that a DAG file needs no torch to read them.
CRITEO_DENSE: Final = tuple(f"int_{i}" for i in range(13))
CRITEO_SPARSE: Final = tuple(f"cat_{i}" for i in range(26))
CRITEO_COLUMNS: Final = ("label", *CRITEO_DENSE, *CRITEO_SPARSE)

# The plausible range of every number here (docs/decisions/0023).
#: Dense columns and sparse features: production ranking models have hundreds to a
#: thousand or so of each.
MAX_FEATURES: Final = 4096
#: Rows of one table: as the model config's (`model_config.MAX_ROWS`).
MAX_ROWS: Final = 2**40
#: Ids one sample has for one feature (a list column's longest bag).
MAX_IDS: Final = 4096
#: Path patterns, and files they may match: a day of logs in a few thousand parts.
MAX_PATTERNS: Final = 256
MAX_FILES: Final = 100_000
#: Bad rows a job may skip: past a billion the data is not this schema.
MAX_BAD_ROWS: Final = 10**9
#: Columns of a TSV line (Criteo has 40).
MAX_COLUMNS: Final = 16_384

_SPARSE_KEYS: Final = ("name", "column", "num_embeddings", "encoding", "max_ids", "vocabulary")
_SCHEMA_KEYS: Final = ("label", "dense", "sparse", "num_embeddings", "encoding")
_DATA_KEYS: Final = ("format", "paths", "schema", "max_bad_rows", "columns",
                     "dense_transform")


class DataSpecError(ValueError):
    """A data spec that cannot be read; the message names the field and the value."""


# -- the tables these are written as -----------------------------------------------------
# `DataSchema.to_dict` writes the schema into a published model's manifest and the compile
# cache's key; `schema_from_dict` reads it back. `DataSpec.to_dict` writes the `data`
# table of a job's trainer config (`operators.lifecycle`, at parse time); the trainer
# reads it as any `data` table a person wrote (`read_data_spec`).


class FeatureTable(TypedDict):
    """One sparse feature of a `SchemaTable`."""

    name: str
    column: str
    num_embeddings: int
    encoding: Encoding
    max_ids: int
    vocabulary: NotRequired[str]


class SchemaTable(TypedDict):
    """A `DataSchema` as a JSON table."""

    label: str
    dense: list[str]
    sparse: list[FeatureTable]


class DataTable(TypedDict):
    """A `DataSpec` of files as the `data` table of a trainer config."""

    format: Format
    schema: SchemaTable
    max_bad_rows: int
    dense_transform: DenseTransform
    paths: NotRequired[list[str]]
    columns: NotRequired[list[str]]


@dataclass(frozen=True, slots=True)
class SparseFeature:
    """One KeyedJaggedTensor key: its `column` in the files, its table's `num_embeddings`
    and the `encoding` of raw values into row ids. `max_ids`: the most ids one sample
    has (1 for a scalar column; a list column's longest bag, longer is a bad row)."""

    name: str
    column: str
    num_embeddings: int
    encoding: Encoding = "hash"
    max_ids: int = 1
    vocabulary: Path | None = None


@dataclass(frozen=True, slots=True)
class DataSchema:
    """The label column, the dense columns (in order) and the sparse features (in
    KeyedJaggedTensor key order)."""

    label: str
    dense: tuple[str, ...]
    sparse: tuple[SparseFeature, ...]

    @property
    def num_dense(self) -> int:
        return len(self.dense)

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.sparse]

    @property
    def tables(self) -> tuple[tuple[str, int], ...]:
        """(feature name, num_embeddings), in key order."""
        return tuple((f.name, f.num_embeddings) for f in self.sparse)

    def to_dict(self) -> SchemaTable:
        """The writer of `SchemaTable` (`schema_from_dict` its reader)."""
        return {"label": self.label, "dense": list(self.dense),
                "sparse": [_feature_table(f) for f in self.sparse]}

    def fingerprint(self) -> str:
        """Canonical JSON of what the shapes of a model built on this schema depend on:
        the dense columns and each key with its table size. Not how ids are made or how
        many a sample has: a restore does not care, and changing them is not another
        model (the data's own identity is the owner's to keep)."""
        shapes = {"dense": list(self.dense), "sparse": [[f.name, f.num_embeddings]
                                                         for f in self.sparse]}
        return json.dumps(shapes, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class DataSpec:
    """Where the data is and what it holds (module docstring). `seed` is the synthetic
    log's (the trainer's seed); files ignore it."""

    format: Format
    schema: DataSchema
    paths: tuple[str, ...] = ()
    max_bad_rows: int = 100
    columns: tuple[str, ...] | None = None  # criteo_tsv: the names of a line's columns
    dense_transform: DenseTransform = "none"
    ids_per_feature: int = 1  # synthetic only: every sample's ids per feature

    @property
    def is_files(self) -> bool:
        return self.format != "synthetic"

    def to_dict(self) -> DataTable:
        """The `data` table that reads back as this spec (`read_data_spec`)."""
        out: DataTable = {"format": self.format, "schema": self.schema.to_dict(),
                          "max_bad_rows": self.max_bad_rows,
                          "dense_transform": self.dense_transform}
        if self.paths:
            out["paths"] = list(self.paths)
        if self.columns is not None:
            out["columns"] = list(self.columns)
        return out



def _feature_table(f: SparseFeature) -> FeatureTable:
    out: FeatureTable = {"name": f.name, "column": f.column,
                         "num_embeddings": f.num_embeddings, "encoding": f.encoding,
                         "max_ids": f.max_ids}
    if f.vocabulary:
        out["vocabulary"] = str(f.vocabulary)
    return out


def synthetic(num_dense: int, tables: tuple[tuple[str, int], ...],
              ids_per_feature: int) -> DataSpec:
    """The generated click log with these shapes (the bundled DLRMs' data)."""
    schema = DataSchema(
        label="label", dense=tuple(f"dense_{i}" for i in range(num_dense)),
        sparse=tuple(SparseFeature(name, name, rows, "id", ids_per_feature)
                     for name, rows in tables))
    return DataSpec("synthetic", schema, ids_per_feature=ids_per_feature)


# -- reading a spec a person wrote ----------------------------------------------------------


def _feature(r: Reader, where: str, name: str, raw: object, defaults: Mapping[str, object],
             base: Path | None) -> SparseFeature:
    """One sparse feature: `rows` (an int: its num_embeddings) or a table of
    `_SPARSE_KEYS` (name given by the key, or by `name` in the list form)."""
    item: Mapping[str, object] = ({"num_embeddings": raw} if isinstance(raw, int)
                                  and not isinstance(raw, bool)
                                  else r.mapping(where, raw, known=_SPARSE_KEYS))
    rows = item.get("num_embeddings", defaults.get("num_embeddings"))
    if rows is None:
        raise r.fail(f"{where}.num_embeddings", None,
                     "missing: give the table size here or schema.num_embeddings for all")
    encoding = r.choice(f"{where}.encoding",
                        item.get("encoding", defaults.get("encoding", "hash")), ENCODINGS)
    vocab_raw = item.get("vocabulary")
    if (vocab_raw is None) != (encoding != "vocabulary"):
        raise r.fail(f"{where}.vocabulary", vocab_raw,
                     "a vocabulary file goes with encoding = 'vocabulary', and only with it")
    return SparseFeature(
        name=name,
        column=r.text(f"{where}.column", item.get("column", name), max_len=256),
        num_embeddings=r.integer(f"{where}.num_embeddings", rows, minimum=1, maximum=MAX_ROWS),
        encoding=encoding,
        max_ids=r.integer(f"{where}.max_ids", item.get("max_ids", 1), minimum=1,
                          maximum=MAX_IDS),
        vocabulary=None if vocab_raw is None else r.path(f"{where}.vocabulary", vocab_raw,
                                                         base=base),
    )


def _sparse(r: Reader, raw: object, defaults: Mapping[str, object], base: Path | None
            ) -> tuple[SparseFeature, ...]:
    """The list form (`[{name, ...}]`) or the mapping form (`{name: rows | {...}}`)."""
    out: list[SparseFeature] = []
    if isinstance(raw, Mapping):
        for name, item in r.mapping("schema.sparse", raw).items():
            r.text("schema.sparse key", name, max_len=256)
            out.append(_feature(r, f"schema.sparse[{name!r}]", name, item, defaults, base))
    else:
        for i, item in enumerate(r.sequence("schema.sparse", raw, min_len=1)):
            where = f"schema.sparse[{i}]"
            table = r.mapping(where, item, known=_SPARSE_KEYS)
            name = r.text(f"{where}.name", table.get("name"), max_len=256)
            out.append(_feature(r, where, name, table, defaults, base))
    if not out:
        raise r.fail("schema.sparse", raw, "needs at least one sparse feature")
    if len(out) > MAX_FEATURES:
        raise r.fail("schema.sparse", f"{len(out)} features", f"must be at most {MAX_FEATURES}")
    names = [f.name for f in out]
    if len(set(names)) != len(names):
        raise r.fail("schema.sparse", names, "feature names must be unique")
    return tuple(out)


def _schema(r: Reader, fmt: str, raw: object, base: Path | None) -> DataSchema:
    table = r.mapping("schema", raw, known=_SCHEMA_KEYS)
    criteo = fmt in ("criteo_tsv", "criteo_npy")
    defaults: dict[str, object] = {k: table[k] for k in ("num_embeddings", "encoding")
                                   if k in table}
    # each format's own convention when the schema names none: Criteo's hex ids in TSV,
    # the .npy form's integers taken modulo the table (TorchRec's), a hash otherwise
    defaults.setdefault("encoding", {"criteo_tsv": "hex", "criteo_npy": "modulo"}.get(fmt,
                                                                                     "hash"))
    if "dense" in table:
        dense = tuple(r.text(f"schema.dense[{i}]", c, max_len=256) for i, c in
                      enumerate(r.sequence("schema.dense", table["dense"])))
    elif criteo:
        dense = CRITEO_DENSE
    else:
        raise r.fail("schema.dense", None, f"missing: the dense columns of {fmt} data "
                                           "(a list, [] for none)")
    if len(dense) > MAX_FEATURES:
        raise r.fail("schema.dense", f"{len(dense)} columns", f"must be at most {MAX_FEATURES}")
    if len(set(dense)) != len(dense):
        raise r.fail("schema.dense", list(dense), "columns must be unique")
    sparse_raw = table.get("sparse")
    if sparse_raw is None and criteo:
        sparse_raw = {name: {} for name in CRITEO_SPARSE}
    elif sparse_raw is None:
        raise r.fail("schema.sparse", None, f"missing: the sparse features of {fmt} data")
    sparse = _sparse(r, sparse_raw, defaults, base)
    label = r.text("schema.label", table.get("label", "label"), max_len=256)
    if label in dense or label in {f.column for f in sparse}:
        raise r.fail("schema.label", label, "is also a feature's column: a label is not an "
                                            "input")
    return DataSchema(label=label, dense=dense, sparse=sparse)


def _npy_or_tsv_columns(r: Reader, fmt: str, schema: DataSchema, raw: object
                        ) -> tuple[str, ...] | None:
    """`columns` (criteo_tsv only): the names of a line's columns in order; default
    TorchRec's Criteo names. Every column the schema uses must be one of them."""
    if fmt != "criteo_tsv":
        if raw is not None:
            raise r.fail("columns", raw, f"is for criteo_tsv data only, not {fmt}")
        if fmt == "criteo_npy":
            _within(r, schema, CRITEO_COLUMNS, "TorchRec's Criteo .npy columns")
        return None
    columns = CRITEO_COLUMNS if raw is None else tuple(
        r.text(f"columns[{i}]", c, max_len=256) for i, c in enumerate(
            r.sequence("columns", raw, min_len=2)))
    if len(columns) > MAX_COLUMNS:
        raise r.fail("columns", f"{len(columns)} columns", f"must be at most {MAX_COLUMNS}")
    if len(set(columns)) != len(columns):
        raise r.fail("columns", list(columns), "names must be unique")
    _within(r, schema, columns, "the line's columns (data.columns)")
    return columns


def _within(r: Reader, schema: DataSchema, columns: tuple[str, ...], what: str) -> None:
    known = set(columns)
    if schema.label not in known:
        raise r.fail("schema.label", schema.label, f"not one of {what}")
    for i, name in enumerate(schema.dense):
        if name not in known:
            raise r.fail(f"schema.dense[{i}]", name, f"not one of {what}")
    for f in schema.sparse:
        if f.column not in known:
            raise r.fail(f"schema.sparse[{f.name!r}].column", f.column, f"not one of {what}")


def read_data_spec(raw: object, *, base: Path | None = None, where: str = "trainer config",
                   error: type[ValueError] = DataSpecError) -> DataSpec:
    """The `data` table a person wrote (a DAG file's dict, TOML, JSON): every value keeps
    its type or is refused with one line naming `data.<field>`; relative paths are under
    `base`. Files are not opened here (the DAG processor may not see them): the trainer
    checks them when its pipeline starts (exit 78 for a missing, empty or foreign file).
    """
    r = Reader(f"{where}: data" if where else "data", error)
    table = r.mapping("data", raw, known=_DATA_KEYS)
    fmt = r.choice("format", table.get("format"), FORMATS)
    if fmt == "synthetic":
        raise r.fail("format", fmt, "is the bundled models' generated log: give a bundled "
                                    "model name for it, or files of your own here")
    patterns = table.get("paths")
    if isinstance(patterns, str):
        patterns = [patterns]
    paths = tuple(str(r.path(f"paths[{i}]", p, base=base)) for i, p in
                  enumerate(r.sequence("paths", patterns, min_len=1)))
    if len(paths) > MAX_PATTERNS:
        raise r.fail("paths", f"{len(paths)} patterns", f"must be at most {MAX_PATTERNS}")
    if fmt == "criteo_npy":
        for i, p in enumerate(paths):
            if not p.endswith("_dense.npy"):
                raise r.fail(f"paths[{i}]", p, "criteo_npy paths name the *_dense.npy files "
                                               "(their _sparse and _labels siblings are read "
                                               "with them)")
    schema = _schema(r, fmt, table.get("schema", {}), base)
    columns = _npy_or_tsv_columns(r, fmt, schema, table.get("columns"))
    transform = r.choice("dense_transform", table.get(
        "dense_transform", "log1p" if fmt == "criteo_tsv" else "none"), DENSE_TRANSFORMS)
    return DataSpec(
        format=fmt,
        schema=schema,
        paths=paths,
        max_bad_rows=r.integer("max_bad_rows", table.get("max_bad_rows", 100), minimum=0,
                               maximum=MAX_BAD_ROWS),
        columns=columns,
        dense_transform=transform,
    )


def describe(spec: DataSpec) -> str:
    """One line for logs: format, patterns, features."""
    where = ", ".join(spec.paths) if spec.paths else "generated"
    return (f"{spec.format} ({where}): {spec.schema.num_dense} dense, "
            f"{len(spec.schema.sparse)} sparse features; label {show(spec.schema.label)}")


def schema_from_dict(data: object) -> DataSchema:
    """A `SchemaTable` written by `DataSchema.to_dict` (a published manifest): read back
    with the same checks, so a damaged manifest fails in one line."""
    r = Reader("manifest: schema", DataSpecError)
    table = r.mapping("schema", data)
    features = tuple(
        SparseFeature(
            name=r.text(f"sparse[{i}].name", item.get("name")),
            column=r.text(f"sparse[{i}].column", item.get("column")),
            num_embeddings=r.integer(f"sparse[{i}].num_embeddings", item.get("num_embeddings"),
                                     minimum=1, maximum=MAX_ROWS),
            encoding=r.choice(f"sparse[{i}].encoding", item.get("encoding"), ENCODINGS),
            max_ids=r.integer(f"sparse[{i}].max_ids", item.get("max_ids", 1), minimum=1,
                              maximum=MAX_IDS),
            vocabulary=None if item.get("vocabulary") is None
            else r.path(f"sparse[{i}].vocabulary", item.get("vocabulary")),
        )
        for i, item in enumerate(r.mapping(f"sparse[{i}]", x) for i, x in enumerate(
            r.sequence("sparse", table.get("sparse"), min_len=1))))
    return DataSchema(label=r.text("label", table.get("label")),
                      dense=r.strings("dense", table.get("dense", [])), sparse=features)
