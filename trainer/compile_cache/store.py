"""`CompileCache`: restore an entry before the first compile, save one after a training
step, and install precompiled forwards in between.

`activate` points inductor at the key's local dir (`inductor.py`), then restores the
entry's parts, each alone: the archive of the inductor dir first (its built kernels),
then the precompiled forwards (read now, unpickled one by one when `precompile` installs
them), then torch's portable artifacts unless the precompiled forwards make them
unnecessary (deferred until a just-in-time compile needs them). A bad entry, or a bad
part, is ignored with a warning and the reason is returned in `CacheLoad`, never raised.
On a miss, the CPU vector-ISA probe (`inductor.VecIsaSettle`) runs on a thread beside the
rest of the compiler's import and dynamo's tracing; the compile waits for its answer
before inductor needs it, and `save` before it records it. `save` writes the parts and
the manifest (`entry.py`). The cache last activated in the
process is `active_cache()`, what `compile_dense` compiles through. Warnings for every
ignored entry or part, info for hits and saves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from airflow_ett.trainer.cache_archive import UnsafeArchiveError, open_archive, safe_extract
from airflow_ett.trainer.compile_cache.entry import (
    ARCHIVE_PREFIX,
    ARTIFACTS_PREFIX,
    MANIFEST_NAME,
    ArchivePart,
    ArtifactsPart,
    EntryError,
    Manifest,
    NoEntry,
    PayloadGone,
    check_key,
    payload,
    payload_bytes,
    read_manifest,
    read_precompiled,
    write_manifest,
    write_payload,
    write_precompiled,
)
from airflow_ett.trainer.compile_cache.inductor import (
    COMPILER_MODULES,
    PROBE_MODULES,
    VecIsaRecord,
    VecIsaSettle,
    import_compiler_modules,
    key_kernels_without_header_switch,
    point_inductor_at,
    set_precompiled_headers,
    torch_precompiled_headers,
)
from airflow_ett.trainer.compile_cache.inductor_dir import (
    default_local_base,
    merge_into,
    not_private,
    pack,
)
from airflow_ett.trainer.compile_cache.key import CACHE_FORMAT
from airflow_ett.trainer.compile_cache.precompiled import PrecompiledForward

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

#: The manifest's `settings`: whether the saver precompiled C++ headers, and whether its
#: kernels' keys leave the header switch out (`key_kernels_without_header_switch`).
HEADERS = "cpp_cache_precompile_headers"
HEADER_FREE_KEYS = "kernel_keys_without_header_switch"


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
    #: Seconds per step of the restore, for the benchmark's table. On a miss the
    #: vector-ISA probe runs on a thread: `vec_isa` is then what the compile (or `save`)
    #: waited for it, added when it first needs the answer, and `vec_isa_probe` what it
    #: took on its thread.
    breakdown: dict[str, float] = field(default_factory=dict, compare=False)


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
    `defer_artifacts=False` loads the artifacts in `activate` even when the entry's
    precompiled forwards make them unnecessary: for a caller that compiles with
    `torch.compile` itself, not through `precompile`.

    `cpu_precompiled_headers`, inductor's C++ header precompiling (`inductor.py`): by
    default (None) a miss compiles with torch's setting (on: the faster cold compile)
    and a hit loads with it off (a warm process on a fresh host would rebuild the
    headers); the kernels are keyed the same either way, so an entry loads whichever way
    it was saved. That suits `precompile`, whose forwards load without the FX graph
    cache. A caller that compiles with `torch.compile` itself passes False (or True): the
    FX graph cache keys its entries on the switch, so saver and loader then keep the same
    one, and an entry saved with the other is ignored.

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
        cpu_precompiled_headers: bool | None = None,
        defer_artifacts: bool = True,
    ) -> None:
        self.root = Path(root)
        self.defer_artifacts = defer_artifacts
        self._local_dir = Path(local_dir) if local_dir is not None else None
        self.restore_inductor_dir = restore_inductor_dir
        self.cpu_precompiled_headers = cpu_precompiled_headers
        self._active: tuple[str, Path] | None = None
        self._vec_isa: VecIsaRecord | None = None
        #: The vector-ISA check `activate` began, until its answer is taken into `_vec_isa`.
        self._isa_settle: VecIsaSettle | None = None
        #: What `activate` set, and `save` records: headers precompiled, kernels' keys free
        #: of the switch.
        self._headers = False
        self._header_free = False
        #: The entry's precompiled forwards (name -> serialized), until `precompile` takes one.
        self._precompiled: dict[str, bytes] = {}
        self._deferred_artifacts: tuple[Path, Manifest] | None = None
        #: Forwards the saver could not compile ahead of time: compiled just in time here.
        self._jit_only: frozenset[str] = frozenset()
        #: Forwards `precompile` installed since `activate`: what `save` stores.
        self._forwards: dict[str, PrecompiledForward] = {}

    # -- paths -------------------------------------------------------------------------

    def local_dir_for(self, key: str) -> Path:
        """The inductor cache dir `activate(key)` points inductor at."""
        if self._local_dir is not None:
            return self._local_dir.absolute()
        return default_local_base() / key

    def entry_dir(self, key: str) -> Path:
        """Where the entry for `key` lives under the shared root."""
        check_key(key)
        return self.root / key

    # -- public API --------------------------------------------------------------------

    def has(self, key: str) -> bool:
        """Whether a complete entry for `key` exists (a readable manifest naming `key`).

        Checksums are not verified here (that is `activate`'s job); this is the cheap
        check a prewarm step uses to skip work.
        """
        try:
            self._read_manifest(key)
        except EntryError:
            return False
        return True

    def activate(self, key: str) -> CacheLoad:
        """Point inductor at this key's local dir and restore the entry for `key` into it.

        Call before the first `torch.compile` of the process (torch may already be
        imported). Never raises for a bad entry: a corrupt, truncated, stale or foreign
        entry, or one part of it, is ignored with a warning and the reason is returned.

        Where there is no manifest at all (a certain miss), the vector-ISA probe begins
        on a thread as soon as the modules it needs are imported, so that it runs beside
        the rest of the compiler's import (and then dynamo's tracing).
        """
        global _ACTIVE
        start = time.perf_counter()
        breakdown: dict[str, float] = {}
        self._take_vec_isa()  # an earlier activate's
        entry = self.entry_dir(key)
        no_entry = not os.path.lexists(entry / MANIFEST_NAME)
        local, unsafe = self._private_local_dir(key)
        with _timed(breakdown, "import_compiler"):  # what any compile imports, cold or warm
            # or what is left of `start_compiler_import`'s; on a certain miss, first what
            # the vector-ISA probe needs, the rest once it has begun
            import_compiler_modules(PROBE_MODULES if no_entry else COMPILER_MODULES)
        self._header_free = key_kernels_without_header_switch()
        switch_problems = point_inductor_at(local)
        if unsafe is not None:
            switch_problems.insert(0, unsafe)
        self._active = (key, local)
        self._precompiled, self._deferred_artifacts, self._forwards = {}, None, {}
        self._jit_only = frozenset()
        _ACTIVE = self
        if no_entry:
            self._set_headers(hit=False)
            self._begin_vec_isa(None, breakdown)
            with _timed(breakdown, "import_compiler"):
                import_compiler_modules()

        for attempt in (1, 2):
            try:
                with _timed(breakdown, "manifest"):
                    manifest = self._read_manifest(key)
            except EntryError as exc:
                miss = "; ".join([str(exc), *switch_problems])
                if isinstance(exc, NoEntry):
                    log.info("compile cache miss for %s: %s", key, miss)
                else:
                    log.warning("compile cache entry for %s ignored: %s", key, miss)
                self._set_headers(hit=False)
                self._begin_vec_isa(None, breakdown)
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
        self._set_headers(hit=hit)
        self._begin_vec_isa(manifest.vec_isa if hit else None, breakdown)
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

    def _private_local_dir(self, key: str) -> tuple[Path, str | None]:
        """The local inductor dir for `key`, created; a fresh private one instead, and why,
        when another user could write the default's parent (and plant kernels there)."""
        local = self.local_dir_for(key)
        unsafe = None if self._local_dir is not None else not_private(local.parent)
        if unsafe is not None:
            local = Path(tempfile.mkdtemp(prefix=f"airflow-ett-inductor-{key}-"))
            unsafe = f"{unsafe}; compiling in the fresh private dir {local} instead"
            log.warning("compile cache: %s", unsafe)
        local.mkdir(parents=True, exist_ok=True)
        return local, unsafe

    def precompile(self, module: torch.nn.Module, name: str, *, dynamic: bool = False) -> bool:
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

    def _restore(
        self, entry: Path, manifest: Manifest, local: Path, breakdown: dict[str, float]
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
        self._jit_only = frozenset(manifest.jit_forwards)
        if self.restore_inductor_dir and manifest.precompiled is not None:
            with _timed(breakdown, "precompiled_read"):
                self._part(done, "precompiled forwards not read",
                           lambda: self._read_precompiled(entry, manifest))
        if (self.defer_artifacts and self._precompiled and done.dir_restored
                and manifest.artifacts is not None):
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
        except EntryError as exc:
            done.gone = done.gone or isinstance(exc, PayloadGone)
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
        self._take_vec_isa()  # what the manifest records
        entry = self.entry_dir(key)
        entry.mkdir(parents=True, exist_ok=True)

        artifacts_meta: ArtifactsPart | None = None
        saved = torch.compiler.save_cache_artifacts()
        if saved is not None:
            blob, info = saved
            counts = {kind: len(keys) for kind, keys in sorted(info.artifacts.items())}
            written = write_payload(entry, ARTIFACTS_PREFIX, ".bin", lambda fh: fh.write(blob))
            artifacts_meta = ArtifactsPart(written.file, written.size, written.sha256,
                                           counts=counts)
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
            file_count, unpacked = pack(local, fh)

        written = write_payload(entry, ARCHIVE_PREFIX, ".tar.gz", write_archive)
        archive_meta = ArchivePart(written.file, written.size, written.sha256,
                                   files=file_count, unpacked_bytes=unpacked)
        precompiled_meta = write_precompiled(entry, {
            name: fwd.serialized for name, fwd in sorted(self._forwards.items())
            if fwd.serialized is not None})

        manifest = Manifest(
            format=CACHE_FORMAT,
            key=key,
            torch=torch.__version__,
            python=f"{sys.version_info.major}.{sys.version_info.minor}",
            settings=self._settings(),
            created=time.time(),
            host=platform.node(),
            artifacts=artifacts_meta,
            inductor_dir=archive_meta,
            precompiled=precompiled_meta,
            jit_forwards=tuple(sorted(name for name, fwd in self._forwards.items()
                                      if fwd.serialized is None)),
            vec_isa=self._vec_isa,
        )
        write_manifest(entry, manifest)
        log.info(
            "compile cache saved %s in %.2fs: artifacts %s B, inductor dir %s B (%d files), "
            "precompiled forwards %s B (%s)",
            entry,
            time.perf_counter() - start,
            artifacts_meta.size if artifacts_meta else 0,
            archive_meta.size,
            file_count,
            precompiled_meta.size if precompiled_meta else 0,
            ", ".join(precompiled_meta.forwards) if precompiled_meta else "none",
        )
        return entry

    # -- internals ---------------------------------------------------------------------

    def _begin_vec_isa(self, recorded: VecIsaRecord | None, breakdown: dict[str, float]
                       ) -> None:
        """Settle the vector ISA (`inductor.VecIsaSettle`, its seconds in `breakdown`): a
        miss (`recorded` None) probes on a thread, whose answer `save` takes; a hit checks
        the entry's answer here, with no probe. Once an activate: a check begun on a
        certain miss answers a hit found after all (an entry saved meanwhile) too."""
        if self._isa_settle is None:
            self._isa_settle = VecIsaSettle.begin(recorded, on_thread=recorded is None,
                                                  timings=breakdown)
        if recorded is not None or not self._isa_settle.on_thread:
            self._take_vec_isa()

    def _take_vec_isa(self) -> None:
        """Wait for the vector-ISA check begun, if any; what it found is what `save`
        records."""
        settle, self._isa_settle = self._isa_settle, None
        if settle is not None:
            found = settle.wait()
            if found is not None:
                self._vec_isa = found

    def _set_headers(self, *, hit: bool) -> None:
        """Precompiled C++ headers for the compile that follows `activate`: as asked, else
        torch's setting for a miss (a cold compile, whose kernels a warm process with them
        off finds: the keys leave the switch out) and off for a hit."""
        headers = self.cpu_precompiled_headers
        if headers is None:
            headers = not hit and self._header_free and torch_precompiled_headers()
        set_precompiled_headers(headers)
        self._headers = headers

    def _settings(self) -> dict[str, bool]:
        """What `save` records of the inductor settings the compile ran with."""
        return {HEADERS: self._headers, HEADER_FREE_KEYS: self._header_free}

    def _settings_problem(self, recorded: dict[str, bool]) -> str | None:
        """Why an entry saved with the inductor settings `recorded` is not for this cache,
        or None.

        Kernels built with headers off never carried the switch in their keys; built with
        them on, only when the saver left it out (`HEADER_FREE_KEYS`). A loader with
        headers off (a hit, by default) finds those; one with them on, kernels keyed as it
        keys them. A cache that fixes the switch (a caller compiling with `torch.compile`
        itself) also needs the saver's switch: the FX graph cache keys on it."""
        headers = recorded.get(HEADERS)
        if not isinstance(headers, bool):
            return f"inductor settings {recorded!r} do not say how C++ headers were built"
        free = not headers or recorded.get(HEADER_FREE_KEYS) is True
        wanted = self.cpu_precompiled_headers
        if wanted is None:  # a hit loads with headers off
            if free:
                return None
            return (f"inductor settings differ: the entry's kernels were built with C++ headers "
                    f"precompiled and keyed on it ({recorded}); this process loads with them "
                    "off")
        if headers == wanted and (not wanted or free == key_kernels_without_header_switch()):
            return None
        return (f"inductor settings differ: entry {recorded}, this process "
                f"{{{HEADERS!r}: {wanted}}}")

    def _read_manifest(self, key: str) -> Manifest:
        return read_manifest(self.entry_dir(key), key, self._settings_problem)

    def _restore_archive(self, entry: Path, manifest: Manifest, local: Path) -> bool:
        """Unpack the archived inductor dir beside `local`, then move it in atomically."""
        archive = payload(entry, manifest.inductor_dir, "inductor dir archive")
        staging = Path(tempfile.mkdtemp(prefix=f".{local.name}.restore-", dir=local.parent))
        try:
            try:
                with open_archive(archive) as tar:  # headers bounded as they are read
                    safe_extract(tar, staging)
            except UnsafeArchiveError as exc:
                raise EntryError(f"archive refused: {exc}") from exc
            except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
                raise EntryError(f"archive unreadable: {type(exc).__name__}: {exc}") from exc
            merge_into(staging, local)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True

    def _load_artifacts(self, entry: Path, manifest: Manifest) -> bool:
        import torch

        meta = manifest.artifacts
        if meta is None:
            raise EntryError("the entry has no portable artifacts (none were recorded)")
        blob = payload_bytes(entry, meta, "artifacts")
        info = torch.compiler.load_cache_artifacts(blob)
        if info is None:
            raise EntryError("torch could not deserialise them (see torch's warning)")
        return True

    def _read_precompiled(self, entry: Path, manifest: Manifest) -> bool:
        """Read the precompiled forwards (`read_precompiled`); unpickled by `precompile`."""
        self._precompiled = read_precompiled(entry, manifest)
        return True


#: The cache `activate` was last called on in this process (what `compile_dense` uses).
_ACTIVE: CompileCache | None = None


def active_cache() -> CompileCache | None:
    """The `CompileCache` last activated in this process, or None.

    Process-wide like inductor's cache directory, which `activate` sets: the compile
    that follows an `activate` is the one that entry is for."""
    return _ACTIVE
