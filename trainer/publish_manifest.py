"""A published model's layout and manifest: the one contract between the writer of a
version (`publish.publish_model`) and its readers (`read_manifest`, here).

    <model>/v<N>/manifest.json        a `Manifest`: what the version is
    <model>/v<N>/weights.safetensors  the weights it describes (`WEIGHTS`)
    <model>/LATEST                    "v<N>": the newest version

A published model is read on other hosts, by other versions of this code: the reader
checks every field and names the one it refuses (`IntegrityError`). Its types and its
reader live here, apart from the code that writes and loads the weights, so that a reader
of the manifest needs neither torch nor the publishing code.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TypedDict, final

from airflow_ett._untrusted import UntrustedFileError, load_json, read_text
from airflow_ett.trainer.model_spec import ModelSpecError, ModelSpecTable, from_dict
from airflow_ett.trainer.readers import Reader
from airflow_ett.trainer.schema import DataSpecError, SchemaTable, schema_from_dict

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
LATEST = "LATEST"
FORMAT = "airflow-ett.published-model"
FORMAT_VERSION = 2
#: 1: the DLRM's config alone (weights still load); 2: the model contract's description.
READABLE_VERSIONS = (1, 2)
RUN_FIELDS = (
    "steps",
    "batch_size",
    "seed",
    "lr_dense",
    "lr_sparse",
    "checkpoint_interval",
    "compile",
)
"""The trainer config fields that define what a run computes (paths, logging, worker
counts and fault injection do not change the weights and are left out)."""

VERSION_DIR: Final = re.compile(r"^v([1-9][0-9]*)$")
"""A published version's directory name: `v<N>`, N from 1."""
#: A published model's manifest lists its weight files and metrics: a few KB.
MAX_MANIFEST_BYTES: Final = 16 << 20


class PublishError(Exception):
    """Publishing or reading a published model failed; the message names the path."""


class NotPublishedError(PublishError, FileNotFoundError):
    """A path that is neither a published version nor a model directory with a LATEST."""


class IntegrityError(PublishError, ValueError):
    """A published file differs from its manifest, or the manifest is not one we read."""


# -- the manifest ------------------------------------------------------------------------


@final
class ModelEntry(ModelSpecTable):
    """The model: its `ModelSpec` (`model_spec.from_dict` reads it back), its identity
    and the data schema it was built on."""

    identity: str
    schema: SchemaTable


@final
class LegacyModelEntry(TypedDict):
    """A format 1 manifest's model: a bundled DLRM's name and config alone."""

    name: str
    config: dict[str, object]


class RunEntry(TypedDict):
    """The `RUN_FIELDS` of the trainer config."""

    steps: int
    batch_size: int
    seed: int
    lr_dense: float
    lr_sparse: float
    checkpoint_interval: int | float | str
    compile: bool


class SkippedEntry(TypedDict):
    path: str
    reason: str


class CheckpointEntry(TypedDict):
    """The checkpoint published: its step and data cursor (its marker's), where it was,
    the world size that wrote it, and the newer ones rejected as invalid."""

    step: int
    cursor: int | None
    path: str
    world_size: int | None
    skipped: list[SkippedEntry]


class WeightsEntry(TypedDict):
    """The weights file and what `publish.load_published` checks it against."""

    file: str
    sha256: str
    file_bytes: int
    tensors: int
    tensor_bytes: int
    dtypes: dict[str, int]


class Manifest(TypedDict):
    """A published version's `manifest.json` (`publish.publish_model` says what each
    field is)."""

    format: str
    format_version: int
    version: int
    model: ModelEntry | LegacyModelEntry  # the legacy form: format 1 only
    run: RunEntry
    checkpoint: CheckpointEntry
    weights: WeightsEntry
    created_at: str
    torch: str
    metrics: dict[str, float]
    ett_summary: dict[str, object]
    extra: dict[str, object]


# -- reading -----------------------------------------------------------------------------


def resolve_version(path: Path) -> Path:
    """A version directory: `path` itself when it holds a manifest, else the version its
    LATEST names (`path` being a model directory)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    latest = path / LATEST
    if not latest.is_file():
        if VERSION_DIR.match(path.name) and path.is_dir():
            raise IntegrityError(f"{path / MANIFEST}: missing (not a published version)")
        raise NotPublishedError(
            f"{path}: neither a published version ({MANIFEST}) nor a model directory "
            f"with a {LATEST} (versions there: {_versions(path) or 'none'})"
        )
    version = read_latest(path)
    if version is None:
        raise IntegrityError(f"{latest}: does not name a version (v<N>)")
    resolved = path / f"v{version}"
    if not (resolved / MANIFEST).is_file():
        raise IntegrityError(f"{latest} names v{version} but {resolved / MANIFEST} is missing")
    return resolved


def _versions(model_dir: Path) -> list[int]:
    """Published versions, ascending."""
    try:
        entries = list(os.scandir(model_dir))
    except OSError:
        return []
    found = (VERSION_DIR.match(e.name) for e in entries if e.is_dir())
    return sorted(int(m.group(1)) for m in found if m)


def read_latest(model_dir: Path) -> int | None:
    """The version LATEST names; None when there is no (well-formed) LATEST."""
    try:  # `v<N>\n`: anything longer is not a LATEST
        text = read_text(model_dir / LATEST, what="LATEST", max_bytes=64).strip()
    except UntrustedFileError:
        return None
    m = VERSION_DIR.match(text)
    return int(m.group(1)) if m else None


def read_manifest(path: Path) -> Manifest:
    """The manifest of a version (or of a model directory's LATEST), every field checked:
    `IntegrityError` naming the file, the field and the value."""
    file = resolve_version(path) / MANIFEST
    try:  # bounded: a regular file of at most MAX_MANIFEST_BYTES, JSON, depth-checked
        manifest = load_json(file, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
    except UntrustedFileError as exc:
        raise IntegrityError(f"{file}: unreadable: {exc.reason}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise IntegrityError(f"{file}: not a published-model manifest")
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        raise IntegrityError(
            f"{file}: format_version {version!r}; this code reads {list(READABLE_VERSIONS)}"
        )
    weights = manifest.get("weights")
    if not isinstance(weights, dict) or not isinstance(weights.get("sha256"), str):
        raise IntegrityError(f"{file}: lacks the weights' sha256")
    r = Reader(f"{file}", IntegrityError)
    return {
        "format": FORMAT,
        "format_version": r.integer("format_version", version),
        "version": r.integer("version", manifest.get("version"), minimum=1),
        "model": _read_model(r, manifest.get("model"), legacy=version == 1),
        "run": _read_run(r, manifest.get("run")),
        "checkpoint": _read_checkpoint(r, manifest.get("checkpoint")),
        "weights": _read_weights(r, weights),
        "created_at": r.text("created_at", manifest.get("created_at")),
        "torch": r.text("torch", manifest.get("torch")),
        "metrics": {key: r.number(f"metrics[{key!r}]", value) for key, value in
                    r.mapping("metrics", manifest.get("metrics", {})).items()},
        "ett_summary": dict(r.mapping("ett_summary", manifest.get("ett_summary", {}))),
        "extra": dict(r.mapping("extra", manifest.get("extra", {}))),
    }


def _read_model(r: Reader, raw: object, *, legacy: bool) -> ModelEntry | LegacyModelEntry:
    """The manifest's `model`, read as its format wrote it. The spec and the schema
    through their own readers (`model_spec.from_dict`, `schema.schema_from_dict`)."""
    table = r.mapping("model", raw)
    if legacy:
        return {"name": r.text("model.name", table.get("name")),
                "config": dict(r.mapping("model.config", table.get("config")))}
    try:
        spec = from_dict(table)
        schema = schema_from_dict(table.get("schema"))
    except (ModelSpecError, DataSpecError) as exc:
        raise IntegrityError(f"{r.where}: bad model description: {exc}") from None
    return {**spec.to_dict(), "identity": r.text("model.identity", table.get("identity")),
            "schema": schema.to_dict()}


def _read_run(r: Reader, raw: object) -> RunEntry:
    table = r.mapping("run", raw)
    interval = table.get("checkpoint_interval")
    if isinstance(interval, bool) or not isinstance(interval, int | float | str):
        raise r.fail("run.checkpoint_interval", interval, "must be steps, seconds or 'auto'")
    return {"steps": r.integer("run.steps", table.get("steps"), minimum=1),
            "batch_size": r.integer("run.batch_size", table.get("batch_size"), minimum=1),
            "seed": r.integer("run.seed", table.get("seed"), minimum=0),
            "lr_dense": r.number("run.lr_dense", table.get("lr_dense")),
            "lr_sparse": r.number("run.lr_sparse", table.get("lr_sparse")),
            "checkpoint_interval": interval,
            "compile": r.boolean("run.compile", table.get("compile"))}


def _read_checkpoint(r: Reader, raw: object) -> CheckpointEntry:
    table = r.mapping("checkpoint", raw)
    cursor, world_size = table.get("cursor"), table.get("world_size")
    skipped = [r.mapping(f"checkpoint.skipped[{i}]", item) for i, item in
               enumerate(r.sequence("checkpoint.skipped", table.get("skipped", [])))]
    return {"step": r.integer("checkpoint.step", table.get("step"), minimum=0),
            "cursor": None if cursor is None
            else r.integer("checkpoint.cursor", cursor, minimum=0),
            "path": r.text("checkpoint.path", table.get("path")),
            "world_size": None if world_size is None
            else r.integer("checkpoint.world_size", world_size, minimum=1),
            "skipped": [{"path": r.text(f"checkpoint.skipped[{i}].path", item.get("path")),
                         "reason": r.text(f"checkpoint.skipped[{i}].reason",
                                          item.get("reason"), empty=True)}
                        for i, item in enumerate(skipped)]}


def _read_weights(r: Reader, table: Mapping[str, object]) -> WeightsEntry:
    return {"file": r.text("weights.file", table.get("file", WEIGHTS)),
            "sha256": r.text("weights.sha256", table.get("sha256")),
            "file_bytes": r.integer("weights.file_bytes", table.get("file_bytes"), minimum=0),
            "tensors": r.integer("weights.tensors", table.get("tensors"), minimum=0),
            "tensor_bytes": r.integer("weights.tensor_bytes", table.get("tensor_bytes"),
                                      minimum=0),
            "dtypes": {key: r.integer(f"weights.dtypes[{key!r}]", count, minimum=0)
                       for key, count in r.mapping("weights.dtypes",
                                                   table.get("dtypes", {})).items()}}
