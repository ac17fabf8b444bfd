"""The cache key: what compiled code depends on, hashed into a short stable name.

Two processes share an entry exactly when they would compile the same code: same model
config and shapes, same torch build, Python, platform and device kind (on CPU the vector
ISA too, since the archived kernels are built for it), same `CACHE_FORMAT`. `key_inputs`
lists what goes in and why; inductor's own keys cover the rest inside a restored entry.
Imports torch only when a key is computed.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from enum import Enum
from pathlib import PurePath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Bump to invalidate every entry written by an older layout of this package. 2 (issue 13):
#: entries hold precompiled forwards; a format-1 entry would be a hit that never gets them.
CACHE_FORMAT = 2
_KEY_HEX_CHARS = 16


def _canonical(value: object) -> object:
    """JSON `default` hook: the few non-JSON types a model config legitimately holds.

    Anything else raises TypeError: a `repr` fallback could embed a memory address and
    silently give every process a different key.
    """
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=lambda v: json.dumps(v, sort_keys=True, default=_canonical))
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    raise TypeError(f"cache_key: {type(value).__name__} is not JSON-serialisable: {value!r}")


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def key_inputs(
    model_config: Mapping[str, object], device_kind: str,
    extra: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """Everything `cache_key` hashes, as a dict (for logs: what made two keys differ).

    What invalidates compiled code, and so is in the key:

    * the model config (canonical JSON: sorted keys, no whitespace), i.e. shapes, table
      sizes, layer widths, dtypes: anything that changes the traced graphs;
    * the torch version string (includes the build tag, `+cpu`/`+cu126`) and its git
      commit (nightlies share version strings), CUDA/HIP versions: artifacts carry no
      cross-version guarantee (`CacheArtifactManager` says so);
    * the Triton version when installed (GPU kernels are built by it);
    * the device kind (`device_kind()`: "cpu" or "cuda:<major>.<minor>"), and on CPU the
      vector ISA torch dispatches to (AVX2, AVX512, ...): the archived `.so` files are
      built for it, so hosts of different ISA keep separate entries instead of
      overwriting each other's;
    * the Python minor version (dynamo is tied to bytecode; artifacts are pickles),
      OS and machine architecture;
    * `CACHE_FORMAT` (the layout of entries);
    * `extra`: whatever else the caller compiles differently with, e.g. torch.compile
      options (mode, dynamic, fullgraph), a world size when graphs depend on it.

    Not in the key, because inductor's own keys cover them and a change only costs a
    miss inside the restored directory: the C++ compiler version, inductor config flags.
    """
    import torch

    inputs: dict[str, object] = {
        "format": CACHE_FORMAT,
        "model_config": dict(model_config),
        "device_kind": device_kind,
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "triton": _package_version("triton") or _package_version("pytorch-triton"),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "platform": f"{sys.platform}-{platform.machine()}",
        "extra": dict(extra or {}),
    }
    if device_kind == "cpu":
        inputs["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return inputs


def cache_key(
    model_config: Mapping[str, object], device_kind: str,
    extra: Mapping[str, object] | None = None,
) -> str:
    """A short stable hex key for compiled code; see `key_inputs` for what goes in.

    Stable across processes and hosts of the same kind (no hash randomisation, no object
    ids), different whenever a listed input differs.
    """
    canonical = json.dumps(
        key_inputs(model_config, device_kind, extra),
        sort_keys=True,
        separators=(",", ":"),
        allow_nan=False,
        default=_canonical,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:_KEY_HEX_CHARS]


def trainer_cache_key(model_config: Mapping[str, object], kind: str, *, batch_size: int,
                      world_size: int) -> str:
    """The key a trainer run compiles under: the one rule shared by the trainer and the
    prewarm operator, which must find the entry the job's ranks will look up."""
    return cache_key(model_config, kind, {"batch_size": batch_size, "world_size": world_size})


def device_kind(device: torch.device | str | None = None) -> str:
    """The device kind for `cache_key`: "cpu", or "cuda:<major>.<minor>" (compute capability).

    `device` is a torch.device, a string like "cuda:1", or None for the current default
    (CUDA when available). Capability, not the device name, decides what kernels run.
    """
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"cuda:{major}.{minor}"
    return dev.type
