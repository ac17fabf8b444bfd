"""DLRM shapes: the bundled model configs and their validation, without torch.

Kept apart from `model.py` so that a DAG file can validate a job's config when Airflow
parses it (every few seconds, in the dag-processor) without importing torch (1 s).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from airflow_ett.trainer.readers import Reader, show


class ModelConfigError(ValueError):
    """A model config that cannot be built; the message names the field and value."""


class ModelConfigTable(TypedDict):
    """A `ModelConfig` as a table (`ModelConfig.to_dict`; `ModelConfig.from_dict` reads
    it, and any table a person wrote, back)."""

    name: str
    num_dense: int
    embedding_dim: int
    tables: list[list[str | int]]  # [name, num_embeddings] pairs
    dense_arch: list[int]
    over_arch: list[int]
    ids_per_feature: int
    extra: dict[str, object]


# The plausible range of every number of a model config (docs/decisions/0023). Memory is
# the preflight's to judge (`preflight.check_memory`); these refuse what no DLRM is.
#: Dense features, the embedding dimension and the ids a sample has per feature: real
#: DLRMs have tens of dense features, dimensions of 16 to 512 and up to a few hundred ids.
MAX_WIDTH = 2**16
#: Rows of one table: the largest production tables have billions; 2**40 is a trillion
#: (and what an int64 id indexes with room to spare).
MAX_ROWS = 2**40
#: Tables (sparse features): production DLRMs have hundreds to about a thousand.
MAX_TABLES = 4096
#: Units of one MLP layer.
MAX_LAYER = 2**20


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shapes of a DLRM. All tables share `embedding_dim` (the interaction is a dot
    product), and the dense arch ends in that dimension so it can interact too."""

    name: str
    num_dense: int
    embedding_dim: int
    tables: tuple[tuple[str, int], ...]  # (feature/table name, num_embeddings)
    dense_arch: tuple[int, ...]
    over_arch: tuple[int, ...]
    ids_per_feature: int = 4
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Checks types too (a bundled config is built in Python, a DAG file may pass
        anything): `num_dense = 8.9` is refused, not truncated to 8."""
        if not isinstance(self.name, str) or not self.name.strip():
            raise ModelConfigError(f"model config: name = {show(self.name)}: must be a "
                                   "non-empty string")
        r = Reader(f"model config {self.name!r}", ModelConfigError)
        r.integer("num_dense", self.num_dense, minimum=1, maximum=MAX_WIDTH)
        r.integer("embedding_dim", self.embedding_dim, minimum=1, maximum=MAX_WIDTH)
        r.integer("ids_per_feature", self.ids_per_feature, minimum=1, maximum=MAX_WIDTH)
        self._check_tables(r)
        self._check_archs(r)
        r.mapping("extra", self.extra)

    def _check_tables(self, r: Reader) -> None:
        """At least one table, each a (unique name, positive integer rows) pair."""
        if not isinstance(self.tables, tuple) or not self.tables:
            raise r.fail("tables", self.tables, "needs at least one table")
        if len(self.tables) > MAX_TABLES:
            raise r.fail("tables", f"{len(self.tables)} tables",
                         f"must be at most {MAX_TABLES} tables")
        for i, table in enumerate(self.tables):
            if not isinstance(table, tuple) or len(table) != 2:
                raise r.fail(f"tables[{i}]", table, "must be a pair [name, num_embeddings]")
            r.text(f"tables[{i}] name", table[0])
        names = [name for name, _ in self.tables]
        if len(set(names)) != len(names):
            raise r.fail("tables", names, "table names must be unique")
        for name, rows in self.tables:
            if isinstance(rows, bool) or not isinstance(rows, int):
                raise r.fail(f"tables[{name}]", rows, "num_embeddings must be an integer")
            if not 0 < rows <= MAX_ROWS:
                raise r.fail(f"tables[{name}]", rows,
                             f"num_embeddings must be > 0 and <= {MAX_ROWS}")

    def _check_archs(self, r: Reader) -> None:
        """Positive layer sizes; the dense arch ends in `embedding_dim`, the over arch in 1."""
        for arch in ("dense_arch", "over_arch"):
            sizes = getattr(self, arch)
            if not isinstance(sizes, tuple):
                raise r.fail(arch, sizes, "must be a tuple of layer sizes")
            if len(sizes) > MAX_TABLES:
                raise r.fail(arch, f"{len(sizes)} layers", f"must be at most {MAX_TABLES} layers")
            for i, size in enumerate(sizes):
                r.integer(f"{arch}[{i}]", size, minimum=1, maximum=MAX_LAYER)
        if not self.dense_arch or self.dense_arch[-1] != self.embedding_dim:
            raise r.fail("dense_arch", self.dense_arch,
                         f"must end in embedding_dim ({self.embedding_dim})")
        if not self.over_arch or self.over_arch[-1] != 1:
            raise r.fail("over_arch", self.over_arch, "must end in 1 (one logit)")

    def to_dict(self) -> ModelConfigTable:
        return {"name": self.name, "num_dense": self.num_dense,
                "embedding_dim": self.embedding_dim,
                "tables": [[name, rows] for name, rows in self.tables],
                "dense_arch": list(self.dense_arch), "over_arch": list(self.over_arch),
                "ids_per_feature": self.ids_per_feature, "extra": copy.deepcopy(self.extra)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ModelConfig:
        """Read a model config a person wrote (TOML, JSON, a DAG file's dict): every value
        keeps the type it was given or is refused; nothing is converted."""
        known = set(cls.__dataclass_fields__)
        where = data.get("name") if isinstance(data, Mapping) else None
        r = Reader("model config" if not isinstance(where, str) else f"model config {where!r}",
                   ModelConfigError)
        r.mapping("model", data)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelConfigError(f"model config: unknown field(s) {unknown}; known: "
                                   f"{sorted(known)}")
        for required in ("name", "num_dense", "embedding_dim", "tables", "dense_arch",
                         "over_arch"):
            if required not in data:
                raise ModelConfigError(f"model config: missing field {required!r}")
        tables = []
        for i, item in enumerate(r.sequence("tables", data["tables"], min_len=1)):
            pair = r.sequence(f"tables[{i}]", item)
            if len(pair) != 2:
                raise r.fail(f"tables[{i}]", item, "must be a pair [name, num_embeddings]")
            tables.append((r.text(f"tables[{i}] name", pair[0]),
                           r.integer(f"tables[{i}] num_embeddings", pair[1], minimum=1,
                                     maximum=MAX_ROWS)))
        return cls(
            name=r.text("name", data["name"]),
            num_dense=r.integer("num_dense", data["num_dense"], minimum=1, maximum=MAX_WIDTH),
            embedding_dim=r.integer("embedding_dim", data["embedding_dim"], minimum=1,
                                    maximum=MAX_WIDTH),
            tables=tuple(tables),
            dense_arch=tuple(r.integer(f"dense_arch[{i}]", x, minimum=1, maximum=MAX_LAYER)
                             for i, x in enumerate(r.sequence("dense_arch", data["dense_arch"]))),
            over_arch=tuple(r.integer(f"over_arch[{i}]", x, minimum=1, maximum=MAX_LAYER)
                            for i, x in enumerate(r.sequence("over_arch", data["over_arch"]))),
            ids_per_feature=r.integer("ids_per_feature", data.get("ids_per_feature", 4),
                                      minimum=1, maximum=MAX_WIDTH),
            extra=dict(r.mapping("extra", data.get("extra", {}))),
        )



def _tables(prefix: str, count: int, rows: int) -> tuple[tuple[str, int], ...]:
    return tuple((f"{prefix}{i}", rows) for i in range(count))


BUNDLED: dict[str, ModelConfig] = {
    # seconds per run on a CPU: what the tests train
    "dlrm_tiny": ModelConfig(
        name="dlrm_tiny", num_dense=8, embedding_dim=8, tables=_tables("cat_", 3, 1000),
        dense_arch=(32, 8), over_arch=(32, 1), ids_per_feature=2,
    ),
    # the demo DAG's model: a few ms per step on a CPU, big enough for checkpoints to cost
    "dlrm_small": ModelConfig(
        name="dlrm_small", num_dense=13, embedding_dim=16, tables=_tables("cat_", 8, 10_000),
        dense_arch=(128, 64, 16), over_arch=(128, 64, 1), ids_per_feature=4,
    ),
    # Criteo-like shapes for a GPU (26 tables of 1M rows x 128: 13 GB of fp32 tables)
    "dlrm_criteo_1m": ModelConfig(
        name="dlrm_criteo_1m", num_dense=13, embedding_dim=128,
        tables=_tables("cat_", 26, 1_000_000), dense_arch=(512, 256, 128),
        over_arch=(1024, 1024, 512, 256, 1), ids_per_feature=8,
    ),
}


def resolve_model_config(name_or_mapping: object) -> ModelConfig:
    if isinstance(name_or_mapping, Mapping):
        return ModelConfig.from_dict(name_or_mapping)
    if not isinstance(name_or_mapping, str):
        raise ModelConfigError(f"model = {show(name_or_mapping)}: must be a bundled model's "
                               f"name ({sorted(BUNDLED)}) or a mapping with the full config")
    found = BUNDLED.get(name_or_mapping)
    if found is None:
        raise ModelConfigError(f"model = {name_or_mapping!r}: not a bundled model "
                               f"({sorted(BUNDLED)}); give a mapping with the full config")
    return found
