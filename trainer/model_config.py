"""DLRM shapes: the bundled model configs and their validation, without torch.

Kept apart from `model.py` so that a DAG file can validate a job's config when Airflow
parses it (every few seconds, in the dag-processor) without importing torch (1 s).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


class ModelConfigError(ValueError):
    """A model config that cannot be built; the message names the field and value."""


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
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        def bad(name: str, value: object, why: str) -> ModelConfigError:
            return ModelConfigError(f"model config {self.name!r}: {name} = {value!r}: {why}")

        if self.num_dense <= 0:
            raise bad("num_dense", self.num_dense, "must be > 0")
        if self.embedding_dim <= 0:
            raise bad("embedding_dim", self.embedding_dim, "must be > 0")
        if not self.tables:
            raise bad("tables", self.tables, "needs at least one table")
        names = [name for name, _ in self.tables]
        if len(set(names)) != len(names):
            raise bad("tables", names, "table names must be unique")
        for name, rows in self.tables:
            if rows <= 0:
                raise bad(f"tables[{name}]", rows, "num_embeddings must be > 0")
        if not self.dense_arch or self.dense_arch[-1] != self.embedding_dim:
            raise bad("dense_arch", self.dense_arch,
                      f"must end in embedding_dim ({self.embedding_dim})")
        if not self.over_arch or self.over_arch[-1] != 1:
            raise bad("over_arch", self.over_arch, "must end in 1 (one logit)")
        if self.ids_per_feature <= 0:
            raise bad("ids_per_feature", self.ids_per_feature, "must be > 0")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tables"] = [list(t) for t in self.tables]
        out["dense_arch"] = list(self.dense_arch)
        out["over_arch"] = list(self.over_arch)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ModelConfigError(f"model config: unknown field(s) {unknown}; known: "
                                   f"{sorted(known)}")
        try:
            return cls(
                name=str(data["name"]),
                num_dense=int(data["num_dense"]),
                embedding_dim=int(data["embedding_dim"]),
                tables=tuple((str(n), int(r)) for n, r in data["tables"]),
                dense_arch=tuple(int(x) for x in data["dense_arch"]),
                over_arch=tuple(int(x) for x in data["over_arch"]),
                ids_per_feature=int(data.get("ids_per_feature", 4)),
                extra=dict(data.get("extra", {})),
            )
        except KeyError as exc:
            raise ModelConfigError(f"model config: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ModelConfigError(f"model config: {exc}") from None

    def fingerprint(self) -> str:
        """Canonical JSON: what the compile-cache key and checkpoints are tied to."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


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


def resolve_model_config(name_or_mapping: str | Mapping[str, Any]) -> ModelConfig:
    if isinstance(name_or_mapping, Mapping):
        return ModelConfig.from_dict(name_or_mapping)
    found = BUNDLED.get(name_or_mapping)
    if found is None:
        raise ModelConfigError(f"model = {name_or_mapping!r}: not a bundled model "
                               f"({sorted(BUNDLED)}); give a mapping with the full config")
    return found
