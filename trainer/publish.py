"""Publish a trained model: the newest committed checkpoint, as a versioned portable artifact.

A checkpoint is private restart state (DCP shards, optimizer, RNG, a world size); a
consumer needs the model alone, in a format any framework reads, and what it is.
`publish_model` loads the newest *valid* committed checkpoint on CPU (validated as a
restart does: markers, checksums, fallback) and writes

    <out_root>/<model name>/v<N>/weights.safetensors   the model's state dict
    <out_root>/<model name>/v<N>/manifest.json         what it is (see `publish_model`)
    <out_root>/<model name>/LATEST                     "v<N>": the newest version

with these promises:

1. **Versions are never shared.** N is allocated by an atomic `mkdir` of the temp
   directory `.v<N>.partial` beside the versions (of two racing publishers one gets
   EEXIST and moves on to N+1), whose creator then checks `v<N>` does not exist yet:
   the temp directory lives from its mkdir to the rename, so no gap is left.
2. **A version is whole or absent.** Everything is written and fsynced inside the temp
   directory, which is then renamed to `v<N>` (atomic) and the parent fsynced: a reader
   never sees a half-written `v<N>`. A crash leaves a `.v<N>.partial` that readers
   ignore; its number is not reused while it is there.
3. **LATEST only moves forward.** It is replaced atomically (temp file, fsync,
   `os.replace`) under an exclusive `flock` of `<model>/.lock`, and only when the new
   version is higher than the one it names: a publisher that got v3 but finishes after
   the one that got v4 leaves LATEST at v4.
4. **What is read is what was published.** `load_published` checks the manifest's
   SHA-256 of the weights file (and its tensor count and bytes) before returning any
   tensor, and says which file differs.

The layout's names, the manifest's types and its reader (`read_manifest`, which
`load_published` goes through) are `publish_manifest.py`'s: the contract between this
writer and every reader. Never imports Airflow; `load_published` needs only torch and
safetensors (no torchrec).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from airflow_ett._fs import atomic_write, fsync_dir, fsync_file
from airflow_ett.trainer.config import TrainerConfig
from airflow_ett.trainer.publish_manifest import (
    FORMAT,
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    VERSION_DIR,
    WEIGHTS,
    IntegrityError,
    Manifest,
    ModelEntry,
    PublishError,
    RunEntry,
    WeightsEntry,
    read_latest,
    read_manifest,
    resolve_version,
)

if TYPE_CHECKING:
    from torch import nn

    from airflow_ett.trainer.final_state import FinalState

log = logging.getLogger(__name__)

_PARTIAL_DIR = re.compile(r"^\.v([1-9][0-9]*)\.partial$")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_CHUNK = 8 * 1024 * 1024
_MAX_ALLOCATION_TRIES = 1000


class NoCheckpointError(PublishError, FileNotFoundError):
    """Nothing to publish: no committed checkpoint that loads (the message says where)."""


@dataclass(frozen=True, slots=True)
class PublishedModel:
    """One published version: `path` is `<out_root>/<name>/v<version>`."""

    name: str
    version: int
    path: Path
    manifest: Manifest

    @property
    def weights_path(self) -> Path:
        return self.path / WEIGHTS

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def step(self) -> int:
        """The training step of the checkpoint published (`manifest["checkpoint"]["step"]`)."""
        return self.manifest["checkpoint"]["step"]

    @property
    def cursor(self) -> int | None:
        """The data cursor of that checkpoint: the samples the weights were trained on."""
        return self.manifest["checkpoint"]["cursor"]


# -- publishing --------------------------------------------------------------------------


def publish_model(
    cfg: TrainerConfig,
    out_root: Path,
    *,
    metrics: Mapping[str, float] | None = None,
    ett_summary: Mapping[str, object] | None = None,
    extra: Mapping[str, object] | None = None,
) -> PublishedModel:
    """Publish the newest valid committed checkpoint of `cfg.checkpoint_dir` as the next
    version of `cfg.model.name` under `out_root`, and point LATEST at it when it is the
    newest.

    The manifest (JSON) holds: `format`/`format_version`; `version`; `model` (`name` and
    its full `config`, enough to rebuild it); `run` (the `RUN_FIELDS` of the trainer
    config); `checkpoint` (`step` and data `cursor` from its commit marker, its `path`,
    `world_size`, and any newer checkpoints `skipped` as invalid); `weights` (`file`,
    `sha256`, `file_bytes`, `tensors`, `tensor_bytes`, `dtypes`); `created_at` (ISO 8601,
    UTC); `torch` (version); and the caller's `metrics`, `ett_summary` and `extra`.

    Everything the manifest takes from the caller and the config is checked before any
    tensor is loaded (finite numbers for metrics, JSON for the rest): a publish step must
    not fail after the expensive part.
    Raises `NoCheckpointError` (a FileNotFoundError) naming the checkpoint directory when
    there is nothing to publish, `PublishError` for everything else it refuses.
    """
    name = cfg.model.name
    if not _SAFE_NAME.match(name):
        raise PublishError(
            f"model name {name!r} cannot name a directory under {out_root} "
            "(letters, digits, '_', '.', '-'; not starting with '.')"
        )
    model: ModelEntry = {**cfg.model.to_dict(),
                         "config": _check_json("model config", cfg.model.config),
                         "identity": cfg.model_identity, "schema": cfg.data.schema.to_dict()}
    run: RunEntry = {"steps": cfg.steps, "batch_size": cfg.batch_size, "seed": cfg.seed,
                     "lr_dense": cfg.lr_dense, "lr_sparse": cfg.lr_sparse,
                     "checkpoint_interval": cfg.checkpoint_interval, "compile": cfg.compile}
    _dumps({"model": model, "run": run}, where="model config and run")
    checked_metrics = _check_metrics(metrics)
    checked_summary = _check_json("ett_summary", ett_summary)
    checked_extra = _check_json("extra", extra)
    final = _restore(cfg)
    tensors = {k: v.detach().contiguous() for k, v in final.tensors.items()}
    model_dir = Path(out_root) / name
    model_dir.mkdir(parents=True, exist_ok=True)
    version, tmp = _allocate(model_dir)
    try:
        weights = _write_weights(tmp / WEIGHTS, tensors)
        manifest: Manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "version": version,
            "model": model,
            "run": run,
            "checkpoint": {
                "step": final.step,
                "cursor": final.cursor,
                "path": os.path.abspath(final.path),
                "world_size": final.extra.get("world_size"),
                "skipped": [
                    {"path": os.path.abspath(p), "reason": why} for p, why in final.skipped
                ],
            },
            "weights": weights,
            "created_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "torch": torch.__version__,
            "metrics": checked_metrics,
            "ett_summary": checked_summary,
            "extra": checked_extra,
        }
        _write_file(tmp / MANIFEST, (_dumps(manifest, where="manifest") + "\n").encode())
        fsync_dir(tmp)
        path = model_dir / f"v{version}"
        os.rename(tmp, path)  # onto a name nobody else can take: see _allocate
        fsync_dir(model_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _advance_latest(model_dir, version)
    log.info(
        "published %s v%d (checkpoint step %d, %d tensors, %d bytes) at %s",
        name,
        version,
        final.step,
        weights["tensors"],
        weights["file_bytes"],
        path,
    )
    return PublishedModel(name=name, version=version, path=path, manifest=manifest)


def _restore(cfg: TrainerConfig) -> FinalState:
    """The trainer's own restore (`final_state.restore_final_state`), its errors as ours.

    A directory holding another model's checkpoints is a bad config (`ConfigError`, exit
    78), the trainer's own preflight rule: restoring them would fail on shapes, and a
    retry would fail the same way."""
    from airflow_ett.trainer.checkpoint import CheckpointError
    from airflow_ett.trainer.config import ConfigError
    from airflow_ett.trainer.final_state import restore_final_state
    from airflow_ett.trainer.preflight import check_checkpoint_owner
    from airflow_ett.trainer.readers import Reader

    check_checkpoint_owner(cfg, Reader("trainer config", ConfigError))
    try:
        return restore_final_state(cfg)
    except FileNotFoundError as exc:
        raise NoCheckpointError(f"nothing to publish: {exc}") from exc
    except CheckpointError as exc:
        raise PublishError(
            f"nothing to publish from {cfg.checkpoint_dir}: {exc}"
        ) from exc


def _check_metrics(metrics: Mapping[str, object] | None) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in (metrics or {}).items():
        if not isinstance(key, str):
            raise PublishError(f"metrics: key {key!r} is not a string")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise PublishError(f"metrics[{key!r}] = {value!r}: not a number")
        if not math.isfinite(value):
            raise PublishError(f"metrics[{key!r}] = {value!r}: not finite (JSON cannot hold it)")
        out[key] = value
    return out


def _check_json(what: str, value: Mapping[str, object] | None) -> dict[str, object]:
    """A JSON round trip: what the manifest will hold, or an error naming `what`."""
    loaded = json.loads(_dumps(dict(value or {}), where=what))
    assert isinstance(loaded, dict)
    return loaded


def _dumps(value: object, *, where: str) -> str:
    try:
        return json.dumps(value, indent=1, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PublishError(f"{where} is not JSON-serialisable: {exc}") from exc


def _numbers(model_dir: Path) -> list[int]:
    """Every version number in use: published (`v<N>`) or being written (`.v<N>.partial`)."""
    out: list[int] = []
    for entry in os.scandir(model_dir):
        m = VERSION_DIR.match(entry.name) or _PARTIAL_DIR.match(entry.name)
        if m:
            out.append(int(m.group(1)))
    return out


def _allocate(model_dir: Path) -> tuple[int, Path]:
    """The next version number and its temp directory, created (so owned) by us.

    Why both the mkdir and the `v<N>` check (see the module docstring): the temp
    directory exists from its mkdir until it is renamed to `v<N>`, so when our mkdir
    succeeds either nobody holds N or its holder already renamed it, and then `v<N>`
    is there to see.
    """
    number = max(_numbers(model_dir), default=0) + 1
    for _ in range(_MAX_ALLOCATION_TRIES):
        tmp = model_dir / f".v{number}.partial"
        try:
            tmp.mkdir()
        except FileExistsError:
            number = max([number, *_numbers(model_dir)]) + 1
            continue
        if (model_dir / f"v{number}").exists():
            tmp.rmdir()
            number = max([number, *_numbers(model_dir)]) + 1
            continue
        return number, tmp
    raise PublishError(f"could not allocate a version in {model_dir} "
                       f"after {_MAX_ALLOCATION_TRIES} tries")


def _write_file(path: Path, data: bytes) -> None:
    """Written and fsynced in place: only for files inside a `.v<N>.partial` directory,
    which becomes visible whole by its own rename (everything else: `atomic_write`)."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _write_weights(path: Path, tensors: dict[str, torch.Tensor]) -> WeightsEntry:
    """safetensors file (fsynced) and its description for the manifest."""
    from safetensors.torch import save_file

    try:
        # One metadata key only: safetensors keeps metadata in a hash map whose order
        # changes from call to call, and the same checkpoint must give the same bytes
        # (same sha256). The model's name and config are in the manifest.
        save_file(tensors, str(path), metadata={"format": "pt"})
    except (ValueError, RuntimeError, OSError) as exc:
        raise PublishError(f"cannot write {path}: {exc}") from exc
    # safetensors writes through a private temp file (mode 0600); a published model is
    # for others to read: give it the mode our own files get (the umask's, as its dir).
    os.chmod(path, path.parent.stat().st_mode & 0o666)
    fsync_file(path)
    file_bytes, digest = _sha256(path)
    dtypes: dict[str, int] = {}
    for tensor in tensors.values():
        dtype = str(tensor.dtype).removeprefix("torch.")
        dtypes[dtype] = dtypes.get(dtype, 0) + 1
    return {
        "file": WEIGHTS,
        "sha256": digest,
        "file_bytes": file_bytes,
        "tensors": len(tensors),
        "tensor_bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "dtypes": dtypes,
    }


def _sha256(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(view):
            digest.update(view[:n])
            size += n
    return size, digest.hexdigest()


@contextlib.contextmanager
def _locked(model_dir: Path) -> Iterator[None]:
    """Exclusive flock of `<model>/.lock` (per open file: threads exclude each other too)."""
    with open(model_dir / ".lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _advance_latest(model_dir: Path, version: int) -> None:
    """Point LATEST at `v<version>` unless it already names a higher version."""
    with _locked(model_dir):
        current = read_latest(model_dir)
        if current is not None and current >= version:
            return
        atomic_write(model_dir / LATEST, f"v{version}\n".encode())


# -- loading -----------------------------------------------------------------------------


def load_published(path: Path) -> tuple[dict[str, torch.Tensor], Manifest]:
    """(state dict on CPU, manifest) of a published version; `path` is a version directory
    or a model directory (then LATEST's version).

    The weights file is checked against the manifest (size and SHA-256, then tensor count
    and bytes) before it is parsed; a mismatch raises `IntegrityError` naming the file.
    """
    version_dir = resolve_version(path)
    manifest = read_manifest(version_dir)
    want = manifest["weights"]
    file = version_dir / want["file"]
    try:
        size, digest = _sha256(file)
    except OSError as exc:
        raise IntegrityError(f"{file}: unreadable: {exc}") from exc
    if size != want["file_bytes"] or digest != want["sha256"]:
        raise IntegrityError(
            f"{file}: sha256 {digest} ({size} bytes) differs from the manifest's "
            f"{want['sha256']} ({want['file_bytes']} bytes): damaged or replaced"
        )
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(file), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise IntegrityError(f"{file}: not a readable safetensors file: {exc}") from exc
    count = len(tensors)
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    if count != want["tensors"] or nbytes != want["tensor_bytes"]:
        raise IntegrityError(
            f"{file}: {count} tensors / {nbytes} bytes, the manifest says "
            f"{want['tensors']} / {want['tensor_bytes']}"
        )
    return tensors, manifest


def build_published_model(path: Path) -> nn.Module:
    """The model of a published version, rebuilt through the model contract from its
    manifest (the factory, its config and the data schema; the factory's code found where
    it was, or as installed) with the weights loaded strictly, in eval mode, on CPU.

    The result is the module the factory returned (its `forward(batch)` gives
    `(loss, output)`; the bundled DLRM's `.model(dense, sparse)` gives logits).
    """
    import torch

    from airflow_ett.trainer.contract import ModelContractError, build_model
    from airflow_ett.trainer.model_spec import from_dict
    from airflow_ett.trainer.schema import schema_from_dict

    version_dir = resolve_version(path)  # once: LATEST may move while we read
    tensors, manifest = load_published(version_dir)
    described = manifest["model"]
    if "identity" not in described:
        raise IntegrityError(f"{version_dir / MANIFEST}: bad model description: format "
                             f"{manifest['format_version']} names no model factory")
    spec, schema = from_dict(described), schema_from_dict(described["schema"])
    if spec.identity(schema.fingerprint()) != described["identity"]:
        raise IntegrityError(f"{version_dir / MANIFEST}: the model description does not give "
                             f"its identity {described['identity']!r}")
    run = manifest["run"]
    try:
        built = build_model(spec, schema, device=torch.device("cpu"),
                            seed=run["seed"], batch_size=run["batch_size"])
    except ModelContractError as exc:
        raise PublishError(f"{version_dir}: cannot rebuild the model: {exc}") from exc
    model = built.module
    try:
        model.load_state_dict(tensors, strict=True)
    except RuntimeError as exc:
        raise IntegrityError(
            f"{version_dir / WEIGHTS}: does not fit model {spec.name!r}: {exc}"
        ) from exc
    return model.eval()


# -- command line ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m airflow_ett.trainer.publish --config FILE --out DIR [--metrics JSON]`:
    publish, print the version directory. Exit 0, 1 (nothing or a refusal to publish),
    or 78 (bad config or arguments: retrying will not help), like the trainer."""
    from airflow_ett.protocol.exits import EXIT_APPLICATION, EXIT_BAD_CONFIG, EXIT_OK
    from airflow_ett.trainer import TorchRecMissingError, require_torchrec
    from airflow_ett.trainer.config import ConfigError, load_config

    parser = argparse.ArgumentParser(
        prog="python -m airflow_ett.trainer.publish",
        description="Publish the newest committed checkpoint as a versioned model.",
    )
    parser.add_argument("--config", required=True, help="trainer config (TOML or JSON)")
    parser.add_argument("--out", required=True, help="root of the published models")
    parser.add_argument("--metrics", default=None, help="JSON object of name: number")
    parser.add_argument("--extra", default=None, help="JSON object stored as is")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_ett").setLevel(logging.INFO)
    try:
        require_torchrec()
        cfg = load_config(args.config)
        metrics = _check_metrics(_json_object("--metrics", args.metrics))
        extra = _json_object("--extra", args.extra)
    except (ConfigError, TorchRecMissingError, ValueError, PublishError) as exc:
        print(f"publish: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    try:
        published = publish_model(cfg, Path(args.out), metrics=metrics, extra=extra)
    except ConfigError as exc:
        print(f"publish: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    except PublishError as exc:
        print(f"publish: error: {exc}", file=sys.stderr)
        return EXIT_APPLICATION
    print(published.path)
    return EXIT_OK


def _json_object(flag: str, text: str | None) -> dict[str, object]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag}: not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: must be a JSON object, got {type(value).__name__}")
    return value


if __name__ == "__main__":
    sys.exit(main())
