"""A shared cache for `torch.compile` output, so a restarted or rescheduled job skips compiling.

Every recovery repeats startup (DESIGN: a startup saving `d` shortens E2E by
`(1 + NoF) * d`), and a cold PT2 compile is the largest piece of it. This module stores
what a compile produced under a key (`cache_key`) in a directory operators can share
between hosts (NFS, a synced bucket mount), and restores it before the next compile.
The measurements behind the choices below are in bench/RESULTS.md ("Compile cache" and
"compile_cache.py: the figures behind its design"); what torch 2.13 does that they rely
on, as read in its source, is in docs/decisions/0004-trainer-choices.md.

What an entry holds, and why both parts
---------------------------------------
* **Portable artifacts** (`torch.compiler.save_cache_artifacts`): the AOTAutograd and FX
  graph cache entries (and, on GPUs, the Triton kernels bundled in them and autotuning
  results): what torch designed its portable cache for. On CPU it is not enough: the
  artifacts carry the generated C++ source, not the built `.so` files, so a process that
  loads only them still builds every kernel with gcc.
* **An archive of the local inductor cache directory** (`TORCHINDUCTOR_CACHE_DIR`): it
  holds the built kernels, the ISA probe's build and the FX/AOTAutograd entries. It is
  host-specific (compiler, CPU ISA), which is why the CPU vector ISA is part of
  `cache_key` on CPU.

* **Precompiled forwards** (issue 13; `CompileCache.precompile`, `PrecompiledForward`):
  each compiled module's forward as torch 2.13's ahead-of-time compile serializes it
  (`aot_compile` of a full graph: dynamo's bytecode, its guards, AOTAutograd's forward
  and backward with inductor's output). A warm start loads them instead of tracing with
  dynamo, rebuilding guards and hashing graphs for cache keys. They need the archive's
  built kernels on CPU, not the artifacts, which are then left unloaded unless a just-in-
  time compile happens after all (restore only what the run needs).

`activate` restores the archive first, then reads the precompiled forwards (unpickled
one by one when `precompile` installs them) and loads the artifacts (which write into
the same directory) unless they are deferred, so each part alone still helps and a bad
part is dropped alone.

What `activate` sets, and why
-----------------------------
* `TORCHINDUCTOR_CACHE_DIR` and `TRITON_CACHE_DIR` for the key, with inductor's memoised
  lookups of them cleared: inductor reads the first on every use, not at `import torch`
  (so setting it late works if it is before the first compile); the second sticks once
  the first kernel launch has set it.
* Precompiled C++ headers off (`cpp_cache_precompile_headers`; `cpu_precompiled_headers=
  True` keeps them): inductor keeps them outside its cache directory, so a warm process
  on a fresh host rebuilt them and lost most of the cache's gain. The price is a slower
  cold compile, paid once per key (in a prewarm task) instead of by every restart. The
  switch is part of the FX graph cache key: it is recorded in the manifest, and an entry
  made with another setting is ignored.
* The CPU vector-ISA probe's answer from the entry instead of probing again, when the
  CPU and compiler are the saver's (`_settle_vec_isa`).
* Each option process-wide, not only for the calling thread (`_set_process_wide`):
  inductor config assignments are per thread, and the trainer may compile on another.
* The caches' own switches (`fx_graph_cache`, `enable_autograd_cache`,
  `autotune_local_cache`, `force_disable_caches`) stay as the user set them; one that
  matters being off is a warning and part of `CacheLoad.reason`.

Entry layout and atomicity
--------------------------
`<root>/<key>/manifest.json` names immutable payload files in the same directory,
`artifacts-<sha>.bin`, `inductor-<sha>.tar.gz` and `precompiled-<sha>.bin` (the
forwards back to back, indexed by name in the manifest), each with size and SHA-256.
The manifest also lists `jit_forwards`, the forwards the saver could not compile ahead
of time, so that a loader compiles them just in time without trying again. A saver
writes each payload atomically (`airflow_ett._fs.atomic_file`: hidden temp file, fsync,
rename into place) and the manifest the same way, last. A reader that sees a manifest
therefore sees complete payloads; two concurrent savers each write their own payload
files and the last manifest wins. Payloads no manifest names are removed by later saves
once older than `_ORPHAN_GRACE_S`, so a reader holding an older manifest has time to
finish; a reader that still finds a payload gone re-reads the manifest once. Directory
fsyncs are best effort (a lost cache entry costs a compile, never a wrong result).

Restoring an archive (and what it does not protect)
---------------------------------------------------
`safe_extract` checks every member of the archive itself before writing anything: only
regular files, directories and links that stay inside the destination; no absolute
names, no `..`, no devices or fifos, no setuid/setgid bits, bounded member count and
sizes. It does not rely on tarfile's extraction filters, which arrived in Python 3.11.4
(Debian 12 ships 3.11.2, where `extractall(filter=...)` is a TypeError and the inductor
dir was never restored). Where the filter exists it is passed as well, on top of the same
checks. This keeps a corrupt or careless archive from writing outside the cache dir; it
does not make an entry trustworthy: the artifacts are pickles and the archive holds
compiled `.so` files that inductor loads, and the precompiled forwards are pickles too
(torch's `AOTCompileUnpickler` and guard unpickler, which import and call what the pickle
names), so whoever can write the cache root can run code in every job that uses it
(docs/security.md). Their checksums, like the others, catch damage, not tampering.

Logging: warnings for every ignored entry or part (with the reason), info for hits and
saves. Nothing here imports Airflow.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import platform
import shutil
import stat
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, is_dataclass
from enum import Enum
from pathlib import Path, PurePath
from typing import IO, Any

from airflow_ett._fs import atomic_file, atomic_write
from airflow_ett._untrusted import (
    MissingFileError,
    UntrustedFileError,
    open_regular,
    parse_json,
    read_bytes,
    read_text,
)
from airflow_ett.trainer.cache_archive import UnsafeArchiveError, open_archive

log = logging.getLogger(__name__)

#: Bump to invalidate every entry written by an older layout of this module. 2 (issue 13):
#: entries hold precompiled forwards; a format-1 entry would be a hit that never gets them.
CACHE_FORMAT = 2
MANIFEST_NAME = "manifest.json"
_ARTIFACTS_PREFIX = "artifacts-"
_ARCHIVE_PREFIX = "inductor-"
_PRECOMPILED_PREFIX = "precompiled-"
#: Payloads no manifest names are deleted by a later save only once this old.
_ORPHAN_GRACE_S = 600.0
#: Inductor-dir entries never archived: lock files are per host and process.
_SKIP_TOP_LEVEL = frozenset({"locks"})
_KEY_HEX_CHARS = 16
_CHUNK = 1 << 20
#: Bounds on one archive restore (a damaged or hostile archive must not fill the disk);
#: far above what an inductor cache dir holds, so only a broken archive reaches them.
MAX_ARCHIVE_MEMBERS = 200_000
MAX_MEMBER_BYTES = 4 << 30
MAX_ARCHIVE_BYTES = 32 << 30
#: A manifest names a few payloads and each precompiled forward's span: a few KB.
MAX_MANIFEST_BYTES = 16 << 20
#: Whether this Python's tarfile has extraction filters (3.11.4+). Checked once; tests
#: set it False to run the path Debian 12's Python 3.11.2 takes.
_HAS_DATA_FILTER = hasattr(tarfile, "data_filter")


# ---------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------


def _canonical(value: Any) -> Any:
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
    model_config: Mapping[str, Any], device_kind: str, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
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
    * this module's `CACHE_FORMAT`;
    * `extra`: whatever else the caller compiles differently with, e.g. torch.compile
      options (mode, dynamic, fullgraph), a world size when graphs depend on it.

    Not in the key, because inductor's own keys cover them and a change only costs a
    miss inside the restored directory: the C++ compiler version, inductor config flags.
    """
    import torch

    inputs: dict[str, Any] = {
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
    model_config: Mapping[str, Any], device_kind: str, extra: Mapping[str, Any] | None = None
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


def trainer_cache_key(model_config: Mapping[str, Any], kind: str, *, batch_size: int,
                      world_size: int) -> str:
    """The key a trainer run compiles under: the one rule shared by the trainer and the
    prewarm operator, which must find the entry the job's ranks will look up."""
    return cache_key(model_config, kind, {"batch_size": batch_size, "world_size": world_size})


def device_kind(device: Any = None) -> str:
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


# ---------------------------------------------------------------------------------------
# Counters
# ---------------------------------------------------------------------------------------


def compile_counters() -> dict[str, int]:
    """Process-wide compile statistics, for the log line and for tests.

    Sources in torch 2.13 (cumulative since process start or `torch._dynamo.reset()`):

    * `graphs`: `counters["stats"]["unique_graphs"]`, FX graphs dynamo produced;
    * `recompiles`: compiles of a frame that had been compiled before (dynamo's compile
      ids `<frame>/<n>` with n > 0), from `convert_frame.FRAME_COMPILE_COUNTER`; dynamo
      keeps no counter for it (the `recompiles` log artifact only prints). Note that a
      second instance of a module class compiled on its own counts too (same `forward`
      code, guards on the instance): the DLRM stand-in's two MLPs give 1;
    * `graph_breaks`: total of `counters["graph_break"]` (one count per break, by reason);
    * `fx_graph_cache_hits` / `_misses` / `_bypasses`: `counters["inductor"]
      ["fxgraph_cache_hit" | "fxgraph_cache_miss" | "fxgraph_cache_bypass"]`, one per
      compiled forward or backward graph;
    * `aot_autograd_cache_hits` / `_misses`: `counters["aot_autograd"]
      ["autograd_cache_hit" | "autograd_cache_miss"]`, one per joint graph;
    * `precompiled_loaded` / `_compiled` / `_fallbacks`: forwards installed by
      `CompileCache.precompile` that were loaded from an entry (no dynamo trace), compiled
      ahead of time here, or called just in time (guards failed, or no ahead-of-time
      compile possible); ours, counted in this module.
    """
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import counters

    def get(group: str, name: str) -> int:
        bucket = counters.get(group)
        return int(bucket.get(name, 0)) if bucket is not None else 0

    breaks = counters.get("graph_break")
    return {
        "graphs": get("stats", "unique_graphs"),
        "recompiles": sum(max(0, n - 1) for n in convert_frame.FRAME_COMPILE_COUNTER.values()),
        "graph_breaks": int(sum(breaks.values())) if breaks is not None else 0,
        "fx_graph_cache_hits": get("inductor", "fxgraph_cache_hit"),
        "fx_graph_cache_misses": get("inductor", "fxgraph_cache_miss"),
        "fx_graph_cache_bypasses": get("inductor", "fxgraph_cache_bypass"),
        "aot_autograd_cache_hits": get("aot_autograd", "autograd_cache_hit"),
        "aot_autograd_cache_misses": get("aot_autograd", "autograd_cache_miss"),
        **{f"precompiled_{name}": n for name, n in _PRECOMPILE_COUNTS.items()},
    }


#: Process-wide counts of `PrecompiledForward` outcomes (see `compile_counters`).
_PRECOMPILE_COUNTS = {"loaded": 0, "compiled": 0, "fallbacks": 0}


def compile_phase_seconds() -> dict[str, float]:
    """Where dynamo and inductor spent this process's compile time, from torch's own
    `compilation_time_metrics` (cumulative; only the phases the benchmark's breakdown
    names): dynamo's bytecode trace, guard build, the backend call (AOTAutograd plus
    inductor, cache lookups included) and inductor's load of compiled output."""
    from torch._dynamo.utils import compilation_time_metrics

    phases = {
        "dynamo_trace": "bytecode_tracing",
        "guard_build": "build_guards",
        "aot_autograd_inductor": "OutputGraph.call_user_compiler",
        "inductor_load": "PyCodeCache.load_by_key_path",
    }
    return {ours: float(sum(compilation_time_metrics.get(theirs, ())))
            for ours, theirs in phases.items()}


def format_counters(c: Mapping[str, int]) -> str:
    """One log line: "graphs 1, recompiles 0, graph breaks 0, cache hits 2/2 (aot 1/1)"."""
    fx_hits, fx_total = (
        c["fx_graph_cache_hits"],
        c["fx_graph_cache_hits"] + c["fx_graph_cache_misses"],
    )
    aot_hits, aot_total = (
        c["aot_autograd_cache_hits"],
        c["aot_autograd_cache_hits"] + c["aot_autograd_cache_misses"],
    )
    line = (
        f"graphs {c['graphs']}, recompiles {c['recompiles']}, graph breaks "
        f"{c['graph_breaks']}, cache hits {fx_hits}/{fx_total} (aot {aot_hits}/{aot_total})"
    )
    pre = [c.get(f"precompiled_{k}", 0) for k in ("loaded", "compiled", "fallbacks")]
    if any(pre):
        line += f", precompiled loaded {pre[0]}, compiled {pre[1]}, just in time {pre[2]}"
    return line


# ---------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheLoad:
    """What `activate` found and restored; reported as part of the compilation phase.

    `hit` is True when an entry existed and at least one part of it (artifacts or
    inductor dir) was restored; `reason` then names a part that was dropped, if any. On a
    miss, `reason` says why (no entry, stale, corrupt, version mismatch).
    """

    key: str
    hit: bool
    artifacts_loaded: bool
    inductor_dir_restored: bool
    seconds: float
    reason: str | None
    #: Names of the precompiled forwards the entry holds (read and checksummed; each is
    #: unpickled only when `precompile` asks for it).
    precompiled: tuple[str, ...] = ()
    #: The artifacts were left unloaded because the entry's precompiled forwards do not
    #: use them; a just-in-time compile in this process loads them first.
    artifacts_deferred: bool = False
    #: Seconds per step of the restore (`_BREAKDOWN_STEPS`), for the benchmark's table.
    breakdown: dict[str, float] = field(default_factory=dict, compare=False)


class _EntryError(Exception):
    """An entry (or one part of it) that must be ignored; the message is the reason."""


class _NoEntry(_EntryError):
    """No entry at all: a plain miss, not worth a warning."""


class _PayloadGone(_EntryError):
    """A payload the manifest names is missing (a concurrent save may have replaced it)."""


@dataclass
class _Restored:
    """What `_restore` did with one manifest."""

    artifacts_loaded: bool = False
    dir_restored: bool = False
    deferred: bool = False
    gone: bool = False  # a payload had vanished (re-read the manifest)
    problems: list[str] = field(default_factory=list)


@contextlib.contextmanager
def _timed(breakdown: dict[str, float], step: str) -> Iterator[None]:
    """Add the block's wall seconds to `breakdown[step]`."""
    start = time.perf_counter()
    try:
        yield
    finally:
        breakdown[step] = breakdown.get(step, 0.0) + time.perf_counter() - start


class _HashingWriter(io.RawIOBase):
    """A write-only file wrapper that counts and hashes what passes through it."""

    def __init__(self, target: IO[bytes]) -> None:
        self._target = target
        self.sha256 = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._target.write(view)
        self.sha256.update(view)
        self.size += len(view)
        return len(view)


def _declared_size(value: Any) -> int:
    """A manifest's size for a payload, as a bound for reading it (0 when it is no size:
    the digest then reads one byte and the size check fails)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return min(value, MAX_ARCHIVE_BYTES)


def _file_digest(path: Path, *, limit: int) -> tuple[int, str]:
    """Size and SHA-256 of the regular file at `path`, read to at most `limit` + 1 bytes
    (a longer file is told by its size without being read to its end, and a FIFO or a
    device is refused: `UntrustedFileError`)."""
    digest = hashlib.sha256()
    size = 0
    with open_regular(path, what="compile cache file") as fh:
        while size <= limit and (chunk := fh.read(min(_CHUNK, limit + 1 - size))):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


class CompileCache:
    """Compile cache entries under a shared `root`, restored into a local inductor dir.

    `root` is any directory path shared by the hosts that should share compiles (NFS, a
    synced bucket mount); it is created on the first save. `local_dir` is where inductor
    works in this process. The default, `$TMPDIR/airflow-ett-inductor-<uid>/<key>`, is per key
    and survives the process, so a restart on the same host finds it warm even before
    restoring; ranks of one job on a host share it (inductor locks its own writes, and the
    restore merges file by file). An explicit `local_dir` is used for every key.

    `restore_inductor_dir=False` loads only the portable artifacts (what the benchmark
    calls "artifacts only"; enough on GPUs whose kernels the artifacts carry).
    `cpu_precompiled_headers=True` leaves inductor's C++ header precompiling on; see the
    module docstring for why it is off by default. `defer_artifacts=False` loads the
    artifacts in `activate` even when the entry's precompiled forwards make them
    unnecessary: for a caller that compiles with `torch.compile` itself, not through
    `precompile`.

    Typical use, rank 0 saving::

        cache = CompileCache(shared_root)
        key = cache_key(model_config, device_kind())
        load = cache.activate(key)       # before the first torch.compile
        model = torch.compile(model); train_step(...)   # forward+backward compiled
        if not load.hit and rank == 0:
            cache.save(key)
    """

    def __init__(
        self,
        root: str | Path,
        *,
        local_dir: str | Path | None = None,
        restore_inductor_dir: bool = True,
        cpu_precompiled_headers: bool = False,
        defer_artifacts: bool = True,
    ) -> None:
        self.root = Path(root)
        self.defer_artifacts = defer_artifacts
        self._local_dir = Path(local_dir) if local_dir is not None else None
        self.restore_inductor_dir = restore_inductor_dir
        self.cpu_precompiled_headers = cpu_precompiled_headers
        self._active: tuple[str, Path] | None = None
        self._vec_isa: dict[str, Any] | None = None
        #: The entry's precompiled forwards (name -> serialized), until `precompile` takes one.
        self._precompiled: dict[str, bytes] = {}
        self._deferred_artifacts: tuple[Path, dict[str, Any]] | None = None
        #: Forwards the saver could not compile ahead of time: compiled just in time here.
        self._jit_only: frozenset[str] = frozenset()
        #: Forwards `precompile` installed since `activate`: what `save` stores.
        self._forwards: dict[str, PrecompiledForward] = {}

    # -- paths -------------------------------------------------------------------------

    def local_dir_for(self, key: str) -> Path:
        """The inductor cache dir `activate(key)` points inductor at."""
        if self._local_dir is not None:
            return self._local_dir.absolute()
        return _default_local_base() / key

    def entry_dir(self, key: str) -> Path:
        """Where the entry for `key` lives under the shared root."""
        _check_key(key)
        return self.root / key

    # -- public API --------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether a complete entry for `key` exists (a readable manifest naming `key`).

        Checksums are not verified here (that is `activate`'s job); this is the cheap
        check a prewarm step uses to skip work.
        """
        try:
            self._read_manifest(key)
        except _EntryError:
            return False
        return True

    def activate(self, key: str) -> CacheLoad:
        """Point inductor at this key's local dir and restore the entry for `key` into it.

        Call before the first `torch.compile` of the process (torch may already be
        imported). Never raises for a bad entry: a corrupt, truncated, stale or foreign
        entry, or one part of it, is ignored with a warning and the reason is returned.
        """
        global _ACTIVE
        start = time.perf_counter()
        breakdown: dict[str, float] = {}
        local = self.local_dir_for(key)
        unsafe = None if self._local_dir is not None else _not_private(local.parent)
        if unsafe is not None:  # another user could plant kernels there: never use it
            local = Path(tempfile.mkdtemp(prefix=f"airflow-ett-inductor-{key}-"))
            unsafe = f"{unsafe}; compiling in the fresh private dir {local} instead"
            log.warning("compile cache: %s", unsafe)
        local.mkdir(parents=True, exist_ok=True)
        with _timed(breakdown, "import_compiler"):  # what any compile imports, cold or warm
            import_compiler_modules()
        switch_problems = self._point_inductor_at(local)
        if unsafe is not None:
            switch_problems.insert(0, unsafe)
        self._active = (key, local)
        self._precompiled, self._deferred_artifacts, self._forwards = {}, None, {}
        self._jit_only = frozenset()
        _ACTIVE = self

        entry = self.entry_dir(key)
        for attempt in (1, 2):
            try:
                with _timed(breakdown, "manifest"):
                    manifest = self._read_manifest(key)
            except _EntryError as exc:
                miss = "; ".join([str(exc), *switch_problems])
                if isinstance(exc, _NoEntry):
                    log.info("compile cache miss for %s: %s", key, miss)
                else:
                    log.warning("compile cache entry for %s ignored: %s", key, miss)
                with _timed(breakdown, "vec_isa"):
                    self._settle_vec_isa(None)
                return CacheLoad(key, False, False, False, time.perf_counter() - start, miss,
                                 breakdown=breakdown)
            restored = self._restore(entry, manifest, local, breakdown)
            if not restored.gone or attempt == 2:
                break
            # A concurrent save replaced the entry and removed the payloads our manifest
            # named: the new manifest names complete ones.
            log.info("compile cache entry %s changed while reading; reading it again", entry)

        artifacts_loaded, dir_restored = restored.artifacts_loaded, restored.dir_restored
        hit = artifacts_loaded or dir_restored or bool(self._precompiled)
        with _timed(breakdown, "vec_isa"):
            self._settle_vec_isa(manifest.get("vec_isa") if hit else None)
        problems = [*restored.problems, *switch_problems]
        seconds = time.perf_counter() - start
        if problems:
            log.warning(
                "compile cache entry %s %s: %s",
                entry,
                "partly used" if hit else "ignored",
                "; ".join(problems),
            )
        log.info(
            "compile cache %s for %s in %.2fs (artifacts %s, inductor dir %s, %d precompiled "
            "forwards)",
            "hit" if hit else "miss",
            key,
            seconds,
            "deferred" if restored.deferred else "loaded" if artifacts_loaded else "not loaded",
            "restored" if dir_restored else "not restored",
            len(self._precompiled),
        )
        return CacheLoad(
            key, hit, artifacts_loaded, dir_restored, seconds, "; ".join(problems) or None,
            precompiled=tuple(sorted(self._precompiled)), artifacts_deferred=restored.deferred,
            breakdown=breakdown,
        )

    def precompile(self, module: Any, name: str, *, dynamic: bool = False) -> bool:
        """Compile `module`'s forward ahead of time, or load it from the active entry.

        Installs a `PrecompiledForward` as the module's `forward` (an instance attribute:
        state-dict keys and hooks are unchanged, as with `nn.Module.compile`). When the
        entry restored by `activate` holds a forward under `name`, it is loaded with its
        guards now (no dynamo trace, no AOTAutograd, no cache-key hashing) and True is
        returned; otherwise the first call compiles it ahead of time on that call's
        arguments and `save` stores it under `name` (unless the entry says the saver could
        not: then it compiles just in time at once, without trying again). `name` must be
        stable across processes (a module path such as "dense_arch") and unique in the
        process.
        """
        if self._active is None:
            raise RuntimeError(f"CompileCache.precompile({name!r}): call activate() first")
        if not name or name in self._forwards:
            raise ValueError(f"precompile: name {name!r} is empty or already used "
                             f"(installed: {sorted(self._forwards)})")
        forward = PrecompiledForward(module, name, self, dynamic=dynamic,
                                     ahead=name not in self._jit_only)
        blob = self._precompiled.pop(name, None)
        loaded = blob is not None and forward.load(blob)
        module.forward = forward
        self._forwards[name] = forward
        return loaded

    def needs_save(self) -> bool:
        """Whether this process compiled something the active entry lacks: a forward
        compiled ahead of time here (an entry that was a hit but could not be loaded, or
        lacked a part the run compiles). `activate`'s `hit` alone misses that case; a
        caller that saves only on a miss would otherwise recompile it on every start."""
        return any(fwd.compiled_here for fwd in self._forwards.values())

    def _settle_vec_isa(self, recorded: Mapping[str, Any] | None) -> None:
        """Skip inductor's CPU vector-ISA probe when the entry already answers it.

        The probe builds and `dlopen`s a test library per candidate ISA in subprocesses
        (7.8 s with nothing cached here, about 1 s of a 3.4 s warm compile). Its answer
        depends on the CPU (in the cache key) and the C++ compiler (recorded in the
        entry). A saver that probed and found every ISA this CPU has buildable records
        that; a loader with the same candidate ISAs and compiler then sets inductor's own
        switch `cpp.vec_isa_ok = True` instead of probing. Otherwise it probes as inductor
        would and sets the switch only if the answer is the same. Saver and loader thus
        end with the same setting, which matters: the switch is part of the FX graph
        cache key. A user's explicit `TORCHINDUCTOR_VEC_ISA_OK` is left alone.
        """
        if platform.machine() not in ("x86_64", "AMD64"):
            return
        try:
            import torch._inductor.config as inductor_config
            from torch._inductor import cpu_vec_isa

            if inductor_config.cpp.vec_isa_ok is not None:
                return
            flags = cpu_vec_isa.x86_isa_checker()
            candidates = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
                          if all(flag in flags for flag in str(isa).split())]
            if not candidates:
                return
            compiler = _compiler_id()
            trusted = bool(
                recorded and recorded.get("ok") is True
                and recorded.get("isas") == candidates and recorded.get("compiler") == compiler
            )
            if not trusted:  # probe now, as inductor would at its first CPU kernel
                trusted = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == candidates
            if trusted:
                _set_process_wide(inductor_config, "cpp.vec_isa_ok", True)
                os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"  # compile worker processes
            self._vec_isa = {"ok": trusted, "isas": candidates, "compiler": compiler}
        except Exception as exc:  # never fail a compile over an optimisation of it
            log.warning("compile cache: vector-ISA check skipped: %r", exc)

    def _restore(
        self, entry: Path, manifest: dict[str, Any], local: Path, breakdown: dict[str, float]
    ) -> _Restored:
        """Restore the parts this run needs. Each part fails alone and never raises.

        The precompiled forwards need the archive's built kernels but not the artifacts
        (those feed dynamo's just-in-time path, which they skip): with precompiled
        forwards in the entry (and the archive restored, so their kernels are there) the
        artifacts are only loaded if a just-in-time compile happens after all
        (`load_deferred_artifacts`)."""
        done = _Restored()
        if self.restore_inductor_dir:
            with _timed(breakdown, "archive"):
                done.dir_restored = self._part(
                    done, "inductor dir not restored",
                    lambda: self._restore_archive(entry, manifest, local))
        jit_only = manifest.get("jit_forwards")
        if isinstance(jit_only, list) and all(isinstance(n, str) for n in jit_only):
            self._jit_only = frozenset(jit_only)
        if self.restore_inductor_dir and manifest.get("precompiled") is not None:
            with _timed(breakdown, "precompiled_read"):
                self._part(done, "precompiled forwards not read",
                           lambda: self._read_precompiled(entry, manifest))
        if (self.defer_artifacts and self._precompiled and done.dir_restored
                and manifest.get("artifacts") is not None):
            self._deferred_artifacts = (entry, manifest)
            done.deferred = True
        else:
            with _timed(breakdown, "artifacts"):
                done.artifacts_loaded = self._part(
                    done, "artifacts not loaded", lambda: self._load_artifacts(entry, manifest))
        return done

    @staticmethod
    def _part(done: _Restored, what: str, restore: Callable[[], bool]) -> bool:
        """Run one part's restore; a failure is a problem recorded in `done`, not raised."""
        try:
            return restore()
        except _EntryError as exc:
            done.gone = done.gone or isinstance(exc, _PayloadGone)
            done.problems.append(f"{what}: {exc}")
        except Exception as exc:  # an unexpected failure must not stop the job
            log.debug("%s", what, exc_info=True)
            done.problems.append(f"{what}: {type(exc).__name__}: {exc}")
        return False

    def load_deferred_artifacts(self) -> bool:
        """Load the artifacts `activate` deferred (see `_restore`), once; True if loaded.

        Called before a just-in-time compile; a failure is a warning, not an error."""
        pending, self._deferred_artifacts = self._deferred_artifacts, None
        if pending is None:
            return False
        try:
            return self._load_artifacts(*pending)
        except Exception as exc:
            log.warning("compile cache: deferred artifacts not loaded: %s", exc)
            return False

    def save(self, key: str) -> Path:
        """Store this process's compile output for `key` under the shared root.

        Call after compiling and running at least one full training step, so the backward
        graph is compiled too. Writes the portable artifacts and a tar.gz of the local
        inductor dir, then the manifest last, each atomically (temp file, fsync, rename).
        Returns the entry directory. I/O errors propagate: the caller decides whether a
        failed save matters (a prewarm task should fail; a training job can go on).
        """
        import torch

        if self._active is None or self._active[0] != key:
            raise RuntimeError(
                f"CompileCache.save({key!r}): activate({key!r}) was not called in this "
                "process, so inductor did not compile into this key's local dir"
            )
        local = self._active[1]
        start = time.perf_counter()
        entry = self.entry_dir(key)
        entry.mkdir(parents=True, exist_ok=True)

        artifacts_meta: dict[str, Any] | None = None
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            blob, info = saved
            counts = {kind: len(keys) for kind, keys in sorted(info.artifacts.items())}
            artifacts_meta = self._write_payload(
                entry, _ARTIFACTS_PREFIX, ".bin", lambda fh: fh.write(blob)
            )
            artifacts_meta["counts"] = counts
        else:
            log.warning(
                "compile cache save for %s: torch recorded no cache artifacts (nothing "
                "compiled in this process?); storing the inductor dir only",
                key,
            )

        file_count = 0
        unpacked = 0

        def write_archive(fh: IO[bytes]) -> None:
            nonlocal file_count, unpacked
            with tarfile.open(fileobj=fh, mode="w:gz", compresslevel=1) as tar:
                for path, arcname in _walk_local(local):
                    try:
                        tar.add(path, arcname=arcname, recursive=False)
                    except FileNotFoundError:  # removed while we walked; not needed
                        continue
                    file_count += 1
                    with contextlib.suppress(OSError):
                        unpacked += path.stat().st_size

        archive_meta = self._write_payload(entry, _ARCHIVE_PREFIX, ".tar.gz", write_archive)
        archive_meta["files"] = file_count
        archive_meta["unpacked_bytes"] = unpacked
        precompiled_meta = self._write_precompiled(entry)

        manifest = {
            "format": CACHE_FORMAT,
            "key": key,
            "torch": torch.__version__,
            "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "settings": self._settings(),
            "created": time.time(),
            "host": platform.node(),
            "artifacts": artifacts_meta,
            "inductor_dir": archive_meta,
            "precompiled": precompiled_meta,
            "jit_forwards": sorted(name for name, fwd in self._forwards.items()
                                   if fwd.serialized is None),
            "vec_isa": self._vec_isa,
        }
        # a cache may be lost, never lie: the directory fsync is best effort
        atomic_write(entry / MANIFEST_NAME, json.dumps(manifest, indent=2, sort_keys=True).encode(),
                     best_effort_dir_sync=True)
        self._remove_orphans(entry, manifest)
        log.info(
            "compile cache saved %s in %.2fs: artifacts %s B, inductor dir %s B (%d files), "
            "precompiled forwards %s B (%s)",
            entry,
            time.perf_counter() - start,
            artifacts_meta["size"] if artifacts_meta else 0,
            archive_meta["size"],
            file_count,
            precompiled_meta["size"] if precompiled_meta else 0,
            ", ".join(precompiled_meta["forwards"]) if precompiled_meta else "none",
        )
        return entry

    def _write_precompiled(self, entry: Path) -> dict[str, Any] | None:
        """One payload with every precompiled forward this process holds, back to back;
        the manifest record indexes them by name. None when there is none."""
        blobs = {name: fwd.serialized for name, fwd in sorted(self._forwards.items())
                 if fwd.serialized is not None}
        if not blobs:
            return None
        index: dict[str, dict[str, int]] = {}
        offset = 0
        for name, blob in blobs.items():
            index[name] = {"offset": offset, "size": len(blob)}
            offset += len(blob)

        def write(fh: IO[bytes]) -> None:
            for blob in blobs.values():
                fh.write(blob)

        meta = self._write_payload(entry, _PRECOMPILED_PREFIX, ".bin", write)
        meta["forwards"] = index
        return meta

    # -- internals ---------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        """Inductor settings saver and loader must share (they are in inductor's keys)."""
        return {"cpp_cache_precompile_headers": self.cpu_precompiled_headers}

    def _point_inductor_at(self, local: Path) -> list[str]:
        """Set inductor's (and Triton's) cache dirs; return cache switches found off."""
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(local)
        os.environ["TRITON_CACHE_DIR"] = str(local / "triton")
        if "torch._inductor.utils" in sys.modules:
            from torch._inductor.utils import clear_caches

            clear_caches()

        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        if not self.cpu_precompiled_headers:
            _set_process_wide(inductor_config, "cpp_cache_precompile_headers", False)
        switches = (
            ("torch._inductor.config.fx_graph_cache is off", not inductor_config.fx_graph_cache),
            (
                "torch._functorch.config.enable_autograd_cache is off",
                not functorch_config.enable_autograd_cache,
            ),
            (
                "torch._inductor.config.force_disable_caches is on",
                bool(inductor_config.force_disable_caches),
            ),
        )
        off = [label for label, is_off in switches if is_off]
        if off:
            problem = f"compile caching is switched off ({', '.join(off)}): entries cannot help"
            log.warning("compile cache: %s", problem)
            return [problem]
        return []

    def _read_manifest(self, key: str) -> dict[str, Any]:
        import torch

        path = self.entry_dir(key) / MANIFEST_NAME
        try:
            raw = read_text(path, what="manifest", max_bytes=MAX_MANIFEST_BYTES)
            manifest = parse_json(raw, what="manifest", path=path)
        except MissingFileError:
            raise _NoEntry(f"no entry for key {key} under {self.root}") from None
        except UntrustedFileError as exc:  # not a regular file, too large, not JSON, deep
            raise _EntryError(f"manifest unreadable: {exc.reason}") from None
        if not isinstance(manifest, dict):
            raise _EntryError("manifest is not a JSON object")
        if manifest.get("format") != CACHE_FORMAT:
            raise _EntryError(
                f"stale entry: cache format {manifest.get('format')!r}, expected {CACHE_FORMAT}"
            )
        if manifest.get("key") != key:
            raise _EntryError(f"manifest names key {manifest.get('key')!r}, not {key!r}")
        if manifest.get("torch") != torch.__version__:
            raise _EntryError(
                f"version mismatch: entry written by torch {manifest.get('torch')}, "
                f"this is {torch.__version__}"
            )
        if manifest.get("settings") != self._settings():
            raise _EntryError(
                f"inductor settings differ: entry {manifest.get('settings')}, "
                f"this process {self._settings()}"
            )
        return manifest

    def _payload(self, entry: Path, meta: Any, what: str) -> Path:
        """The verified path of a payload named in a manifest (size and SHA-256 checked)."""
        if not isinstance(meta, dict) or not {"file", "size", "sha256"} <= meta.keys():
            raise _EntryError(f"manifest has no valid {what} record")
        name = meta["file"]
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise _EntryError(f"manifest names a bad {what} file {name!r}")
        path = entry / name
        try:
            size, digest = _file_digest(path, limit=_declared_size(meta["size"]))
        except MissingFileError:
            raise _PayloadGone(f"{what} file {name} is missing") from None
        except UntrustedFileError as exc:
            raise _EntryError(f"{what} file {name}: {exc.reason}") from None
        if size != meta["size"]:
            raise _EntryError(
                f"{what} file {name} has {size} bytes, manifest says {meta['size']} (truncated?)"
            )
        if digest != meta["sha256"]:
            raise _EntryError(f"{what} file {name} fails its checksum (corrupt)")
        return path

    def _payload_bytes(self, entry: Path, meta: Any, what: str) -> bytes:
        """A verified payload's bytes, read again bounded by its verified size (a file
        swapped since is refused, not read without bound)."""
        path = self._payload(entry, meta, what)
        try:
            return read_bytes(path, what=f"{what} file", max_bytes=int(meta["size"]))
        except UntrustedFileError as exc:
            raise _EntryError(str(exc)) from None

    def _restore_archive(self, entry: Path, manifest: dict[str, Any], local: Path) -> bool:
        """Unpack the archived inductor dir beside `local`, then move it in atomically."""
        archive = self._payload(entry, manifest.get("inductor_dir"), "inductor dir archive")
        staging = Path(tempfile.mkdtemp(prefix=f".{local.name}.restore-", dir=local.parent))
        try:
            try:
                with open_archive(archive) as tar:  # headers bounded as they are read
                    safe_extract(tar, staging)
            except UnsafeArchiveError as exc:
                raise _EntryError(f"archive refused: {exc}") from exc
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                raise _EntryError(f"archive unreadable: {type(exc).__name__}: {exc}") from exc
            _merge_into(staging, local)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def _load_artifacts(self, entry: Path, manifest: dict[str, Any]) -> bool:
        import torch

        meta = manifest.get("artifacts")
        if meta is None:
            raise _EntryError("the entry has no portable artifacts (none were recorded)")
        blob = self._payload_bytes(entry, meta, "artifacts")
        info = torch.compiler.load_cache_artifacts(blob)
        if info is None:
            raise _EntryError("torch could not deserialise them (see torch's warning)")
        return True

    def _read_precompiled(self, entry: Path, manifest: dict[str, Any]) -> bool:
        """Read and checksum the precompiled forwards' payload; split it by the manifest's
        index (name -> offset, size). Nothing is unpickled here: `precompile` does that for
        the forwards the run installs."""
        meta = manifest["precompiled"]
        blob = self._payload_bytes(entry, meta, "precompiled forwards")
        index = meta.get("forwards")
        if not isinstance(index, dict) or not index:
            raise _EntryError(f"precompiled forwards index is not a non-empty object: {index!r}")
        parts: dict[str, bytes] = {}
        for name, span in index.items():
            offset, size = (span.get("offset"), span.get("size")) if isinstance(span, dict) \
                else (None, None)
            if not (isinstance(name, str) and name and isinstance(offset, int)
                    and isinstance(size, int) and offset >= 0 and size > 0
                    and offset + size <= len(blob)):
                raise _EntryError(f"precompiled forwards index: bad span {name!r}: {span!r} "
                                  f"(payload has {len(blob)} bytes)")
            parts[name] = blob[offset:offset + size]
        self._precompiled = parts
        return True

    def _write_payload(
        self, entry: Path, prefix: str, suffix: str, write: Callable[[IO[bytes]], object]
    ) -> dict[str, Any]:
        """Write a payload through `write(fh)`, hashed on the way, and rename it to its
        content-addressed name. Returns its manifest record."""
        with atomic_file(entry / prefix.rstrip("-"), best_effort_dir_sync=True) as out:
            hashing = _HashingWriter(out.file)
            buffered = io.BufferedWriter(hashing, buffer_size=_CHUNK)
            write(buffered)
            buffered.flush()
            digest = hashing.sha256.hexdigest()
            name = f"{prefix}{digest[:32]}{suffix}"
            out.path = entry / name  # content-addressed: named once all is written
        return {"file": name, "size": hashing.size, "sha256": digest}

    def _remove_orphans(self, entry: Path, manifest: Mapping[str, Any]) -> None:
        """Delete payloads no manifest names, once older than the grace period (a reader
        may still hold the manifest that named them)."""
        keep = {
            meta["file"]
            for meta in (manifest.get("artifacts"), manifest.get("inductor_dir"),
                         manifest.get("precompiled"))
            if isinstance(meta, dict)
        }
        now = time.time()
        for path in entry.iterdir():
            name = path.name
            is_payload = name.startswith((_ARTIFACTS_PREFIX, _ARCHIVE_PREFIX, _PRECOMPILED_PREFIX))
            is_stale_tmp = name.startswith(".") and name.endswith(".tmp")
            if name in keep or not (is_payload or is_stale_tmp):
                continue
            with contextlib.suppress(OSError):
                if now - path.stat().st_mtime > _ORPHAN_GRACE_S:
                    path.unlink()


# ---------------------------------------------------------------------------------------
# Precompiled forwards
# ---------------------------------------------------------------------------------------

#: The cache `activate` was last called on in this process (what `compile_dense` uses).
_ACTIVE: CompileCache | None = None


def active_cache() -> CompileCache | None:
    """The `CompileCache` last activated in this process, or None.

    Process-wide like inductor's cache directory, which `activate` sets: the compile
    that follows an `activate` is the one that entry is for."""
    return _ACTIVE


class PrecompiledForward:
    """A module's forward compiled ahead of time (`torch._dynamo.aot_compile`), with its
    guards, and a just-in-time fallback.

    Why: on a warm start dynamo still traces every compiled frame, builds its guards,
    hashes the graph for the AOTAutograd and FX cache keys, and only then loads the
    cached kernels. torch 2.13's ahead-of-time compile (`torch.compile(fn, fullgraph=
    True).aot_compile(...)`, loaded by `AOTCompiledFunction.deserialize`) serializes the
    whole result instead: the dynamo bytecode, the guards, and AOTAutograd's forward and
    backward with inductor's output (bundled), so a warm process skips all of that and
    trains (forward and backward) from the loaded function. On CPU the bundle carries
    the generated C++ source, not the built library: the entry's archived inductor dir
    still supplies the `.so` files (without them each kernel is rebuilt).

    Each call checks the loaded guards (tensor shapes, dtypes, strides, grad mode, the
    module's attributes the trace read; ID and dict-version guards cannot be serialized
    and are dropped, as torch does for every precompiled function). A call they reject,
    or a module that cannot be compiled as one full graph, runs `torch.compile` just in
    time instead (the entry's artifacts are loaded first), with a warning: a stale or
    foreign entry costs a compile, never a wrong result.
    """

    def __init__(self, module: Any, name: str, cache: CompileCache, *, dynamic: bool,
                 ahead: bool = True) -> None:
        self.name = name
        self._module = module
        self._fn = type(module).forward
        self._cache = cache
        self._dynamic = dynamic
        self._aot: Any = None
        self._jit: Any = None
        self._tried_ahead = not ahead
        self._warned = False
        #: Compiled ahead of time in this process (not loaded): `needs_save`.
        self.compiled_here = False
        #: What `CompileCache.save` stores for this forward (loaded or compiled here).
        self.serialized: bytes | None = None
        #: Seconds `load` took (unpickling, kernel loading, guard build).
        self.load_seconds = 0.0

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled (dynamo pickles the module's attributes with its guards; `deepcopy`)
        as the module's plain eager forward: a copy is never tied to this compile."""
        return _eager_forward, (self._fn, self._module)

    def load(self, serialized: bytes) -> bool:
        """Load a forward `save` stored; False (with a warning) if torch refuses it."""
        start = time.perf_counter()
        try:
            from torch._dynamo.aot_compile import AOTCompiledFunction

            self._aot = AOTCompiledFunction.deserialize(serialized)
        except Exception as exc:  # a foreign or damaged entry: compile instead
            log.warning("compile cache: precompiled forward %s not loaded (%s: %s); it "
                        "compiles on first call", self.name, type(exc).__name__, exc)
            return False
        finally:
            self.load_seconds = time.perf_counter() - start
        self.serialized = serialized
        _PRECOMPILE_COUNTS["loaded"] += 1
        return True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module, aot = self._module, self._aot
        if aot is None and not self._tried_ahead:
            self._tried_ahead = True
            aot = self._aot = self._compile_ahead(args, kwargs)
        if aot is not None:
            if aot.guard_check(module, *args, **kwargs):
                return aot.fn(module, *args, **kwargs)
            if not self._warned:
                self._warned = True
                reason = aot._artifacts.guard_manager.check_verbose(
                    aot.prepare_f_locals(module, *args, **kwargs))
                log.warning("compile cache: precompiled forward %s rejects this call (%s); "
                            "compiling it just in time", self.name, reason)
        return self._just_in_time(args, kwargs)

    def _compile_ahead(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Compile on this call's arguments and serialize at once (what `save` stores).
        None, with a warning, when torch cannot (a graph break, an unserializable part)."""
        import torch
        from torch._dynamo.aot_compile import AOTCompiledFunction

        try:
            wrapped: Any = torch.compile(self._fn, fullgraph=True, dynamic=self._dynamic)
            compiled = wrapped.aot_compile(((self._module, *args), kwargs))
            self.serialized = AOTCompiledFunction.serialize(compiled).serialized_data
            self.compiled_here = True
        except Exception as exc:
            log.warning("compile cache: forward %s cannot be compiled ahead of time (%s: %s); "
                        "compiling it just in time (the cache then keeps only kernels and "
                        "torch's artifacts for it)", self.name, type(exc).__name__, exc)
            return None
        _PRECOMPILE_COUNTS["compiled"] += 1
        return compiled

    def _just_in_time(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._jit is None:
            import torch

            self._cache.load_deferred_artifacts()
            self._jit = torch.compile(self._fn, dynamic=self._dynamic)
        _PRECOMPILE_COUNTS["fallbacks"] += 1
        return self._jit(self._module, *args, **kwargs)


#: torch's compiler modules every compile of ours imports, cold or warm, jit or
#: precompiled: dynamo and inductor (the `torch._inductor` package imports dynamo), the
#: C++ builder (vector-ISA check, kernel loading), AOTAutograd's runtime, and what
#: inductor's generated wrapper modules import in their header (`select_algorithm`,
#: `codegen.memory_planning`). Measured on the 2-core machine (2026-12-02), these imports
#: are most of a warm precompiled start.
COMPILER_MODULES = (
    "torch._inductor.config",
    "torch._functorch.config",
    "torch._inductor.cpp_builder",
    "torch._inductor.codecache",
    "torch._functorch.aot_autograd",
    "torch._dynamo.aot_compile",
    "torch._inductor.select_algorithm",
    "torch._inductor.codegen.memory_planning",
)


def import_compiler_modules() -> None:
    """Import `COMPILER_MODULES` (a no-op once imported). `activate` does it first, so
    its breakdown shows the import apart from the work; a caller with an I/O wait to
    spare (a process-group init, a storage connection) can call it on a thread before
    `activate` to overlap the import with that wait."""
    import importlib

    for name in COMPILER_MODULES:
        importlib.import_module(name)


def _eager_forward(fn: Callable[..., Any], module: Any) -> Callable[..., Any]:
    """`fn` bound to `module`: what a pickled `PrecompiledForward` becomes."""
    import types

    return types.MethodType(fn, module)


def _set_process_wide(config_module: Any, name: str, value: Any) -> None:
    """Set a torch config option for every thread, not just the caller's.

    In torch 2.13 `torch._inductor.config.x = v` is a `ContextVar` override: a thread
    started later (or any other thread) still sees the default (checked: main False,
    new thread True). The trainer may compile on another thread than the one that
    called `activate` (parallel init), and a compile that ran with other settings
    than the saver's misses the FX graph cache. So the option's default is changed too
    (private `_config[name].default`; skipped with a warning if torch moves it).
    """
    setattr(config_module, name, value)
    entry = getattr(config_module, "_config", {}).get(name)
    if entry is not None and hasattr(entry, "default"):
        entry.default = value
    else:
        log.warning(
            "compile cache: cannot set %s.%s for other threads; call activate() on the "
            "thread that compiles",
            config_module.__name__,
            name,
        )


def _compiler_id() -> str:
    """The C++ compiler inductor will use, with its version line."""
    import subprocess

    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = get_cpp_compiler()
    done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                          timeout=30, check=False)
    first = done.stdout.splitlines()[0] if done.stdout else f"exit {done.returncode}"
    return f"{compiler}: {first}"


def _default_local_base() -> Path:
    """Per user: `$TMPDIR` is shared by every user of the host, and inductor loads the
    `.so` files it finds in its cache dir."""
    return Path(tempfile.gettempdir()).absolute() / f"airflow-ett-inductor-{os.geteuid()}"


def _not_private(base: Path) -> str | None:
    """Why `base` (created 0o700 when missing) cannot hold this user's inductor dirs: a
    symlink, another owner, or writable by group or others. None when it is private."""
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700, parents=True)
    st = base.lstat()
    if not os.path.isdir(base) or os.path.islink(base):
        return f"local inductor dir base {base} is not a plain directory"
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return (f"local inductor dir base {base} is not private to this user (owner uid "
                f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
    return None


def _check_key(key: str) -> None:
    if not key or not all(c.isalnum() or c in "-_." for c in key) or key.startswith("."):
        raise ValueError(f"bad compile cache key {key!r}: use cache_key()")


def _walk_local(local: Path) -> Iterator[tuple[Path, str]]:
    """Files and dirs of the inductor dir worth archiving, with their archive names.

    Skips lock files (per host) and inductor's in-flight temp files (hidden `*.tmp`).
    """
    for dirpath, dirnames, filenames in os.walk(local):
        rel = Path(dirpath).relative_to(local)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_TOP_LEVEL]
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".tmp") or name.endswith(".lock"):
                continue
            path = Path(dirpath) / name
            if path.is_symlink():
                continue
            yield path, str(rel / name)


def _merge_into(staging: Path, local: Path) -> None:
    """Move the unpacked tree into `local`: one rename when `local` is empty, otherwise
    file by file, each an atomic rename, keeping files already there (another rank or an
    earlier attempt on this host may be using them)."""
    with contextlib.suppress(OSError):
        local.rmdir()  # only succeeds when empty
    if not local.exists():
        try:
            os.rename(staging, local)
            staging.mkdir()  # the caller removes it
            return
        except OSError:
            pass  # lost a race with another restorer: merge instead
    local.mkdir(parents=True, exist_ok=True)
    for dirpath, _dirnames, filenames in os.walk(staging):
        rel = Path(dirpath).relative_to(staging)
        target_dir = local / rel
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in filenames:
            target = target_dir / name
            if not target.exists():
                os.replace(Path(dirpath) / name, target)


# ---------------------------------------------------------------------------------------
# Safe archive extraction
# ---------------------------------------------------------------------------------------


def safe_extract(
    tar: tarfile.TarFile,
    dest: str | Path,
    *,
    max_members: int = MAX_ARCHIVE_MEMBERS,
    max_member_bytes: int = MAX_MEMBER_BYTES,
    max_total_bytes: int = MAX_ARCHIVE_BYTES,
) -> int:
    """Extract `tar` into the directory `dest` after checking every member; returns the
    number of members. Raises `UnsafeArchiveError` (nothing written) when one is refused.

    The checks are ours, the same on every Python 3.11.x, and all done before the first
    byte is written, so a refused archive leaves `dest` as it was. Refused: absolute
    names, `..` components, duplicate names, anything but regular files, directories,
    symlinks and hardlinks (devices, fifos), setuid/setgid/sticky bits, links whose
    target (resolved through the archive's own symlinks) leaves `dest`, hardlinks to
    anything but a regular file of the archive, members above `max_member_bytes`,
    more than `max_members` members or `max_total_bytes` in all. Accepted members are
    extracted with the attributes tarfile's "data" filter would give them (no owner, mode
    limited to 0o755, owner read/write on files), and where the filter exists (3.11.4+) it
    runs too, as a second line.
    """
    dest = Path(dest)
    checked: list[tarfile.TarInfo] = []
    seen: dict[tuple[str, ...], tarfile.TarInfo] = {}
    links: dict[tuple[str, ...], str] = {}
    total = 0
    for member in tar:  # lazily: a huge member count is refused before it is all read
        if len(checked) >= max_members:
            raise UnsafeArchiveError(f"more than {max_members} members")
        parts = _member_parts(member.name)
        what = f"member {member.name!r}"
        if parts in seen:
            raise UnsafeArchiveError(f"{what}: appears twice")
        _check_member_kind(member, what, max_member_bytes)
        total += member.size
        if total > max_total_bytes:
            raise UnsafeArchiveError(f"more than {max_total_bytes} bytes in all at {what}")
        seen[parts] = member
        if member.issym():
            links[parts] = member.linkname
        checked.append(member)
    for member in checked:
        _check_placement(member, seen, links)
    safe = [_data_attrs(member) for member in checked]
    if _HAS_DATA_FILTER:
        tar.extractall(dest, members=safe, numeric_owner=True, filter="data")
    else:
        tar.extractall(dest, members=safe, numeric_owner=True)
    return len(safe)


def _check_member_kind(member: tarfile.TarInfo, what: str, max_member_bytes: int) -> None:
    """Refuses a member by itself: special files, setuid/setgid/sticky bits, oversize."""
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveError(f"{what}: not a regular file, directory or link "
                                 f"(device, fifo or other special file)")
    if member.mode & 0o7000:
        raise UnsafeArchiveError(f"{what}: setuid/setgid/sticky mode {member.mode:o}")
    if member.size > max_member_bytes:
        raise UnsafeArchiveError(f"{what}: {member.size} bytes, over {max_member_bytes}")


def _member_parts(name: str, label: str = "member") -> tuple[str, ...]:
    """A member name (or a hardlink's target) as path parts; refuses absolute names and
    `..`."""
    what = f"{label} {name!r}"
    if not name or "\x00" in name:
        raise UnsafeArchiveError(f"{what}: empty name or NUL byte")
    if name.startswith(("/", os.sep)) or os.path.isabs(name):
        raise UnsafeArchiveError(f"{what}: absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise UnsafeArchiveError(f"{what}: '..' component")
    if not parts:
        raise UnsafeArchiveError(f"{what}: names the destination itself")
    return parts


def _resolve(parts: tuple[str, ...], links: Mapping[tuple[str, ...], str]) -> tuple[str, ...]:
    """Where `parts` lands under the destination, following the archive's own symlinks as
    the filesystem would once they are extracted; raises when it would leave it."""
    out: list[str] = []
    todo = list(parts)
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                raise UnsafeArchiveError("resolves outside the destination")
            out.pop()
            continue
        out.append(part)
        target = links.get(tuple(out))
        if target is not None:
            hops += 1
            if hops > 40:
                raise UnsafeArchiveError("symlink loop")
            if target.startswith(("/", os.sep)) or os.path.isabs(target):
                raise UnsafeArchiveError(f"goes through a symlink to the absolute {target!r}")
            out.pop()
            todo = [*target.split("/"), *todo]
    return tuple(out)


def _check_placement(
    member: tarfile.TarInfo,
    seen: Mapping[tuple[str, ...], tarfile.TarInfo],
    links: Mapping[tuple[str, ...], str],
) -> None:
    """The member's directory, and a link's target, stay inside the destination."""
    parts = _member_parts(member.name)
    what = f"member {member.name!r}"
    try:
        _resolve(parts[:-1], links)
        if member.issym():
            if member.linkname.startswith(("/", os.sep)) or os.path.isabs(member.linkname):
                raise UnsafeArchiveError(f"symlink to the absolute {member.linkname!r}")
            _resolve((*parts[:-1], *member.linkname.split("/")), links)
        elif member.islnk():
            target = _member_parts(member.linkname, "hardlink to")
            if _resolve(target, links) != target or not (
                target in seen and seen[target].isreg()
            ):
                raise UnsafeArchiveError(
                    f"hardlink to {member.linkname!r}, not a regular file of the archive"
                )
    except UnsafeArchiveError as exc:
        raise UnsafeArchiveError(f"{what}: {exc}") from None


def _data_attrs(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """A copy with the attributes tarfile's "data" filter gives (3.11.4+), set by hand so
    that 3.11.2 extracts the same: no owner, mode limited to 0o755, files owner-rw."""
    safe = copy.copy(member)
    mode = member.mode & 0o755
    if member.isreg() or member.islnk():
        if not mode & 0o100:
            mode &= ~0o111
        mode |= 0o600
    elif member.isdir():
        mode = 0o755
    safe.mode = mode
    safe.uid, safe.gid = os.geteuid(), os.getegid()
    safe.uname = safe.gname = ""
    return safe
