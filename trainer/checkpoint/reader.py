"""Reading a checkpoint as untrusted input: DCP's metadata and leaves without running code.

A commit marker's CRCs catch damage, not tampering: whoever can write the checkpoint
directory can rewrite the marker too. DCP itself reads `.metadata` with a plain
`pickle.load` and non-tensor leaves (optimizer hyperparameters, say) with
`torch.load(weights_only=False)`, so a crafted checkpoint ran code in the restoring process
(train and publish hosts; decision 0006). Every read therefore goes through
`SafeFileSystemReader`, whose unpickler admits only `METADATA_GLOBALS` (DCP's metadata
classes, torch sizes, dtypes, layouts and memory formats, `pathlib` paths and plain
builtins), after `files` bounded the file's size and the pickle's work, and
`SafeLoadPlanner`, which loads those leaves with `torch.load(weights_only=True)`.
`load_into` is a restore's DCP load through both. See docs/security.md for what remains a
trust boundary.
"""

from __future__ import annotations

import enum
import io
import pickle
from pathlib import Path
from typing import IO, Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from airflow_ett.trainer.checkpoint.files import (
    UntrustedFileError,
    pickle_work,
    read_metadata_bytes,
)
from airflow_ett.trainer.checkpoint.results import StateDict

#: The only globals a checkpoint's `.metadata` pickle may name: what DCP (torch 2.13)
#: writes for plain, ShardedTensor and DTensor state (found by listing the globals of
#: real checkpoints' metadata with pickletools), and builtins that build plain data.
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [
        *(
            ("torch.distributed.checkpoint.metadata", name)
            for name in (
                "Metadata", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
                "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                "_MEM_FORMAT_ENCODING",
            )
        ),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # looks a torch.layout up by its name
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("collections", "OrderedDict"),
        # Not bytes, bytearray or range: called with a huge int they allocate (or let
        # list() allocate) without bound; pickle has opcodes for real bytes values.
        *(
            ("builtins", name)
            for name in (
                "dict", "list", "tuple", "set", "frozenset", "str", "int", "float",
                "complex", "bool", "slice",
            )
        ),
    ]
)


class UnsafeCheckpointError(pickle.UnpicklingError):
    """Checkpoint metadata that names a global outside `METADATA_GLOBALS`."""


class _MetadataUnpickler(pickle.Unpickler):
    """`pickle.Unpickler` that resolves only `METADATA_GLOBALS` (and torch's dtypes and
    memory formats, which pickle as `torch.<name>`): nothing else can be called or built,
    so a crafted pickle fails here instead of running."""

    def find_class(self, module: str, name: str) -> object:
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.memory_format | torch.layout
        ):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"checkpoint metadata names the forbidden global {module}.{name} (only DCP "
            "metadata classes and plain builtins are allowed)"
        )

    def persistent_load(self, pid: object) -> NoReturn:
        raise UnsafeCheckpointError("checkpoint metadata uses persistent ids")


def _enum_member(cls: object, name: object) -> enum.Enum:
    """The one `getattr` a metadata pickle may call: an enum member of an allowed enum.

    Python 3.11.0-3.11.3 pickle enum members as `getattr(EnumClass, "NAME")` (3.11.4+ as
    `EnumClass(value)`), so checkpoints written on Debian 12's 3.11.2 name
    `builtins.getattr` for DCP's `_MEM_FORMAT_ENCODING`. A real `getattr` would reach any
    attribute (`__init__.__globals__`, modules, `os.system`): only members pass."""
    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and (cls.__module__, cls.__qualname__) in METADATA_GLOBALS
        and isinstance(name, str)
        and name in cls.__members__
    ):
        return cls[name]
    raise UnsafeCheckpointError(
        f"checkpoint metadata calls getattr({getattr(cls, '__qualname__', cls)!r}, "
        f"{name!r}): only members of DCP's metadata enums are allowed"
    )


def read_checkpoint_metadata(stream: IO[bytes]) -> Metadata:
    """A DCP `.metadata` pickle read through the restricted unpickler; raises
    `UnsafeCheckpointError` for anything but DCP metadata."""
    metadata = _MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(
            f"checkpoint metadata is a {type(metadata).__name__}, not DCP Metadata"
        )
    return metadata


def load_checkpoint_metadata(path: Path) -> Metadata:
    """The `.metadata` file at `path`, read bounded (`files`: a regular file of
    bounded size whose pickle makes bounded work), then by the restricted unpickler;
    `UnsafeCheckpointError` for anything else."""
    try:
        data = read_metadata_bytes(path)
    except UntrustedFileError as exc:
        raise UnsafeCheckpointError(exc.reason) from None
    problem = pickle_work(data)
    if problem is not None:
        raise UnsafeCheckpointError(problem)
    return read_checkpoint_metadata(io.BytesIO(data))


class SafeFileSystemReader(FileSystemReader):
    """DCP's `FileSystemReader` with `.metadata` read by `load_checkpoint_metadata`
    instead of a plain `pickle.load` (torch 2.13's `read_metadata`, otherwise the same)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:  # torch's signature
        metadata = load_checkpoint_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor leaves (DCP's "bytes" items: optimizer
    hyperparameters, small Python values) are loaded with `torch.load(weights_only=True)`
    rather than DCP's `weights_only=False`, another pickle path into the process."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def load_into(state: StateDict, path: Path, group: dist.ProcessGroup | None) -> str | None:
    """DCP's load of the checkpoint at `path` into `state` in place, through the restricted
    reader and planner (a collective over `group`, local without one); why it failed, or
    None."""
    try:
        dcp_load(
            state,
            storage_reader=SafeFileSystemReader(path),
            planner=SafeLoadPlanner(),
            process_group=group,
            no_dist=group is None,
        )
    except (Exception, CheckpointException) as exc:  # the latter is a BaseException
        return f"{type(exc).__name__}: {_first_line(exc)}"
    return None


def _first_line(exc: BaseException) -> str:
    """DCP's CheckpointException carries every rank's traceback; a reason needs the error.

    Its message lists each failing rank's traceback, whose last line is the error."""
    text = str(exc).strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if isinstance(exc, CheckpointException) and lines:
        return lines[-1].strip()
    return lines[0] if lines else type(exc).__name__
