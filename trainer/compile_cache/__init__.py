"""A shared cache for `torch.compile` output, so a restarted or rescheduled job skips compiling.

Every recovery repeats startup (DESIGN: a startup saving `d` shortens E2E by
`(1 + NoF) * d`), and a cold PT2 compile is the largest piece of it. `CompileCache` stores
what a compile produced under a key (`cache_key`) in a directory hosts can share (NFS, a
synced bucket mount) and restores it before the next compile. An entry has three parts,
each restored alone, so that a bad one is dropped alone:

* torch's portable artifacts (`save_cache_artifacts`): AOTAutograd and FX graph entries,
  on GPUs with their Triton kernels; on CPU they carry C++ source, not built kernels;
* an archive of the local inductor dir (`inductor_dir.py`): the built kernels; host-
  specific, hence the CPU vector ISA in the key;
* precompiled forwards (`precompiled.py`): each compiled module's forward compiled ahead
  of time with its guards, loaded on a warm start instead of traced again by dynamo.

Contract: `activate(key)` before the process's first compile; compile (`precompile`, or
`torch.compile`) and run a full training step; then `save(key)` if the entry missed or
`needs_save()`. A bad entry never fails a job: it costs a compile, never a wrong result.
Its checksums catch damage, not tampering: the payloads are pickles and `.so` files, so
whoever can write the cache root can run code in every job that uses it (docs/security.md).

Modules: `key`, `store` (`CompileCache`), `entry` (manifest and payload files),
`inductor` (what `activate` sets in torch), `inductor_dir`, `precompiled`, `counters`;
archives are read through `trainer/cache_archive.py`. Figures: bench/RESULTS.md ("Compile
cache"); reasons and torch internals: docs/decisions/0004-trainer-choices.md. Nothing here
imports Airflow, nor torch before it is used.
"""

from __future__ import annotations

from airflow_ett.trainer.compile_cache.counters import (
    compile_counters,
    compile_phase_seconds,
    format_counters,
)
from airflow_ett.trainer.compile_cache.entry import MANIFEST_NAME
from airflow_ett.trainer.compile_cache.inductor import (
    COMPILER_MODULES,
    compiler_import_ahead,
    import_compiler_modules,
    start_compiler_import,
)
from airflow_ett.trainer.compile_cache.key import (
    CACHE_FORMAT,
    cache_key,
    device_kind,
    key_inputs,
    trainer_cache_key,
)
from airflow_ett.trainer.compile_cache.precompiled import PrecompiledForward

# Saved precompiled forwards pickle this under the package's name (see precompiled.py).
from airflow_ett.trainer.compile_cache.precompiled import _eager_forward as _eager_forward
from airflow_ett.trainer.compile_cache.store import CacheLoad, CompileCache, active_cache

__all__ = [
    "CACHE_FORMAT",
    "COMPILER_MODULES",
    "MANIFEST_NAME",
    "CacheLoad",
    "CompileCache",
    "PrecompiledForward",
    "active_cache",
    "cache_key",
    "compile_counters",
    "compile_phase_seconds",
    "compiler_import_ahead",
    "device_kind",
    "format_counters",
    "import_compiler_modules",
    "key_inputs",
    "start_compiler_import",
    "trainer_cache_key",
]
