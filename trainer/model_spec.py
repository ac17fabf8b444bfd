"""Which model a job trains: a factory named by import path, its config, its code identity.

Torch-free, and it imports none of the owner's code: a DAG file states
`model="ranking.towers:build"` and the dag-processor checks it every few seconds, where
importing the owner's module would import torch (seconds) and run whatever the module
does at import. So the module is *found* without being run (`importlib.machinery.
PathFinder` over `sys.path` and the DAG's own folder, never a package `__init__`), its
source is read bounded and parsed (`ast`) to see that it defines the factory, and its
code identity is a hash of that source and its sibling modules. The trainer imports it
(`trainer/contract.py`), with the folder it was found in on `sys.path`.

The identity (`ModelSpec.identity`) ties checkpoints and compile-cache entries to the
model: the factory, the source of its module and of the modules beside it (the files of
its package directory, not below), the config table and the data schema. A change to
any of them is another model: its job refuses the old checkpoints (preflight) and
compiles under another cache key.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from typing import Final, TypedDict

from airflow_ett._untrusted import UntrustedFileError, read_bytes
from airflow_ett.trainer.readers import Reader, show

#: The bundled DLRM's factory: one implementation of the contract like any other.
DLRM_FACTORY: Final = "airflow_ett.trainer.models.dlrm:build"
_PATH = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*):"
                   r"([A-Za-z_][A-Za-z0-9_]*)$")
#: A model's module: source code, not data. Past this it is not a module a person wrote.
MAX_SOURCE_BYTES: Final = 4 << 20
#: Modules of one package directory hashed into the identity.
MAX_SIBLINGS: Final = 512
#: The config table handed to the factory: canonical JSON of at most this many bytes.
MAX_CONFIG_BYTES: Final = 256 << 10


class ModelSpecError(ValueError):
    """A model that cannot be found or named; the message names the field and value."""


class ModelSpecTable(TypedDict):
    """A `ModelSpec` as JSON: `ModelSpec.to_dict` its writer, `from_dict` its reader (a
    published model's manifest describes its model with it)."""

    name: str
    factory: str
    config: dict[str, object]
    code_path: str | None
    code: str


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """`factory` ("package.module:function"), the `config` table passed to it, and
    `code_path`: the directory the factory's top-level package or module was found in,
    put on the trainer's `sys.path` (None: importable as installed). `code` is the
    source identity (`code_identity`), fixed when the spec is read, so that every task
    of a job agrees on it even if the file changes under a running job."""

    name: str
    factory: str
    config: Mapping[str, object] = field(default_factory=dict)  # JSON values (`_config`)
    code_path: Path | None = None
    code: str = ""

    @property
    def module(self) -> str:
        return self.factory.split(":", 1)[0]

    @property
    def attribute(self) -> str:
        return self.factory.split(":", 1)[1]

    def identity(self, schema_fingerprint: str) -> str:
        """What a checkpoint and a compile-cache entry of this model are tied to."""
        text = json.dumps({"factory": self.factory, "code": self.code, "config": self.config,
                           "schema": schema_fingerprint}, sort_keys=True,
                          separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> ModelSpecTable:
        return {"name": self.name, "factory": self.factory, "config": dict(self.config),
                "code_path": None if self.code_path is None else str(self.code_path),
                "code": self.code}


def split_factory(where: str, value: object) -> tuple[str, str]:
    """`"a.b:c"` -> ("a.b", "c"), or `ModelSpecError` naming `where` and the value."""
    if not isinstance(value, str) or not _PATH.match(value):
        raise ModelSpecError(f"{where} = {show(value)}: must be an import path "
                             "'package.module:function' (a bundled model's name has no ':')")
    module, attribute = value.split(":", 1)
    return module, attribute


def locate(module: str, search: Iterable[Path]) -> tuple[Path, Path]:
    """(source file of `module`, the directory its top-level name was found in), found
    without importing anything: `PathFinder` on `search`, then down the packages'
    `__path__`. `ModuleNotFoundError` saying where it looked."""
    parts = module.split(".")
    dirs = [str(p) for p in search]
    spec: ModuleSpec | None = PathFinder.find_spec(parts[0], dirs)
    if spec is None:  # installed another way (an editable install's finder): still not run
        spec = importlib.util.find_spec(parts[0])
    if spec is None:
        shown = ", ".join(dirs[:6]) + (" ..." if len(dirs) > 6 else "")
        raise ModuleNotFoundError(f"no module {parts[0]!r} in {shown}")
    root = _root_of(spec, parts[0])
    for depth in range(1, len(parts)):
        locations = spec.submodule_search_locations
        if locations is None:
            raise ModuleNotFoundError(f"{'.'.join(parts[:depth])!r} is a module, not a "
                                      f"package: no {parts[depth]!r} inside it")
        found = PathFinder.find_spec(".".join(parts[:depth + 1]), list(locations))
        if found is None:
            raise ModuleNotFoundError(f"no module {'.'.join(parts[:depth + 1])!r} in "
                                      f"{', '.join(locations)}")
        spec = found
    if spec.origin is None or not spec.origin.endswith(".py"):
        raise ModuleNotFoundError(f"{module!r} is not a Python source file "
                                  f"({spec.origin or 'a namespace package'})")
    return Path(spec.origin), root


def _root_of(spec: ModuleSpec, top: str) -> Path:
    """The sys.path entry `top` was found in."""
    origin = Path(spec.origin) if spec.origin else Path(next(iter(
        spec.submodule_search_locations or []), "."))
    if spec.submodule_search_locations is not None and spec.origin:
        return origin.parent.parent  # .../<top>/__init__.py
    if spec.submodule_search_locations is not None:
        return origin.parent  # a namespace package: .../<top>
    return origin.parent  # .../<top>.py


def _binds(node: ast.stmt, attribute: str) -> bool:
    """Whether one top-level statement binds `attribute` (or may, dynamically)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return node.name in (attribute, "__getattr__")
    if isinstance(node, ast.Import | ast.ImportFrom):
        return any(alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == attribute
                   for alias in node.names)
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(n, ast.Name) and n.id == attribute
                   for target in targets for n in ast.walk(target))
    return False


def defines(source: bytes, attribute: str, *, file: Path) -> bool:
    """Whether the module's source binds `attribute` at its top level (a def, a class, an
    assignment, an import) or may do so dynamically (`from x import *`, `__getattr__`)."""
    try:
        tree = ast.parse(source, filename=str(file))
    except (SyntaxError, ValueError) as exc:
        raise ModelSpecError(f"{file}: not valid Python: {exc}") from None
    return any(_binds(node, attribute) for node in tree.body)


def code_identity(file: Path, module: str) -> str:
    """SHA-256 (16 hex) of the module's source and, for a module inside a package, of
    every other `.py` file of its directory (the modules beside it, where its model
    classes usually live), in name order; each read bounded."""
    files = [file]
    if "." in module:
        siblings = sorted(p for p in file.parent.glob("*.py") if p != file)
        if len(siblings) > MAX_SIBLINGS:
            raise ModelSpecError(f"{file.parent}: more than {MAX_SIBLINGS} modules beside "
                                 f"{file.name}: not a model package")
        files.extend(siblings)
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(_source(path))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _source(path: Path) -> bytes:
    try:
        return read_bytes(path, what="model source", max_bytes=MAX_SOURCE_BYTES)
    except UntrustedFileError as exc:
        raise ModelSpecError(str(exc)) from None


def _config(where: str, config: object) -> dict[str, object]:
    if config is None:
        return {}
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise ModelSpecError(f"{where}: model_config = {show(config)}: must be a table with "
                             "string keys")
    try:
        text = json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ModelSpecError(f"{where}: model_config = {show(config)}: must hold JSON values "
                             f"only (numbers, strings, booleans, lists, tables): {exc}") from None
    if len(text) > MAX_CONFIG_BYTES:
        raise ModelSpecError(f"{where}: model_config: {len(text):,} bytes of JSON, more than "
                             f"{MAX_CONFIG_BYTES:,}")
    loaded = json.loads(text)  # a copy holding JSON values only
    assert isinstance(loaded, dict)
    return loaded


def read_model_spec(factory: object, config: object = None, *, where: str = "trainer config",
                    code_path: object = None, search: Iterable[Path] = ()) -> ModelSpec:
    """The owner's model: `factory` checked as an import path, its module found on
    `code_path` (when given), else on `search` and `sys.path`, its source parsed for the
    factory's name and hashed. No owner code runs. One `ModelSpecError` line naming
    `model` (or `model_config`) for anything wrong."""
    module, attribute = split_factory(f"{where}: model", factory)
    if code_path is not None:
        if not isinstance(code_path, str | os.PathLike) or not os.fspath(code_path):
            raise ModelSpecError(f"{where}: model_code_path = {show(code_path)}: must be a "
                                 "directory path")
        dirs = [Path(os.fspath(code_path))]
    else:
        dirs = [*search, *(Path(p) for p in sys.path if p)]
    try:
        file, root = locate(module, dirs)
    except (ModuleNotFoundError, OSError) as exc:
        raise ModelSpecError(f"{where}: model = {factory!r}: cannot find module {module!r}: "
                             f"{exc}") from None
    source = _source(file)
    if not defines(source, attribute, file=file):
        raise ModelSpecError(f"{where}: model = {factory!r}: {file} defines no {attribute!r} "
                             "at its top level")
    return ModelSpec(
        name=module.rsplit(".", 1)[-1] if attribute == "build" else attribute,
        factory=f"{module}:{attribute}",
        config=_config(where, config),
        code_path=root.resolve(),
        code=code_identity(file, module),
    )


def from_dict(data: object, *, where: str = "model") -> ModelSpec:
    """A `ModelSpecTable` written by `ModelSpec.to_dict` (a published manifest), read
    back field by field: `ModelSpecError` naming the field and value."""
    r = Reader(where, ModelSpecError)
    table = r.mapping("(table)", data)
    code_path = table.get("code_path")
    config = table.get("config")
    return ModelSpec(name=r.text("name", table.get("name")),
                     factory=r.text("factory", table.get("factory")),
                     config={} if config is None else dict(r.mapping("config", config)),
                     code_path=None if code_path is None else r.path("code_path", code_path),
                     code=r.text("code", table.get("code", ""), empty=True))
