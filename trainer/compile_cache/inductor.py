"""What `CompileCache.activate` sets in torch's compiler before the first compile, and why.

* `TORCHINDUCTOR_CACHE_DIR` and `TRITON_CACHE_DIR` for the key, with inductor's memoised
  lookups of them cleared (`point_inductor_at`): inductor reads the first on every use,
  not at `import torch`, so setting it late works if it is before the first compile; the
  second sticks once the first kernel launch has set it.
* Precompiled C++ headers (`set_precompiled_headers`): on for a cold compile, as torch
  has them (a kernel build then reads one prebuilt header instead of parsing ATen's
  vector headers again), off for a warm one: inductor keeps them outside its cache dir,
  so a warm process on a fresh host would rebuild them (~150 MB) before it looks for a
  built kernel. The kernels' build command is made the same either way
  (`key_kernels_without_header_switch`), so what a cold process built is what a warm one
  looks up. The switch is part of the FX graph cache key, so the entry's manifest
  records it.
* The CPU vector-ISA probe's answer from the entry instead of probing again, when the CPU
  and compiler are the saver's (`settle_vec_isa`); on a miss the probe runs on a thread
  beside the rest of the start (`VecIsaSettle`), and inductor's compile waits for its
  answer (`wait_for_vec_isa`).
* Each option process-wide, not only for the calling thread (`set_process_wide`):
  inductor config assignments are per thread, and the trainer may compile on another.
* The caches' own switches stay as the user set them; one that matters being off is
  reported as a problem.

Torch's compiler modules can be imported ahead, on a thread (`start_compiler_import`),
while the process waits on something else; `activate` then waits for that import.

The torch internals this relies on (torch 2.13, read in its source) are in
docs/decisions/0004-trainer-choices.md; the figures in bench/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

#: torch's compiler modules every compile of ours imports, cold or warm, jit or
#: precompiled: dynamo and inductor (the `torch._inductor` package imports dynamo), the
#: C++ builder (vector-ISA check, kernel loading), AOTAutograd's runtime, and what
#: inductor's generated wrapper modules import in their header (`select_algorithm`,
#: `codegen.memory_planning`). These imports are most of a warm precompiled start
#: (bench/RESULTS.md, "Compile cache: precompiled forwards").
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


#: What the vector-ISA probe (`VecIsaSettle`) imports, with what `activate` uses before it
#: starts the probe (`point_inductor_at`, `key_kernels_without_header_switch`): the C++
#: builder, the code cache it writes its test programs through, and `cpp_extension` (with
#: setuptools), which the builder imports when it first builds. A miss imports them on
#: its own thread before the probe's thread starts (`import_compiler_modules`), so that
#: thread imports nothing: two threads importing torch's cyclic packages at once can meet
#: in a cycle of module locks (`start_compiler_import`). Not in `COMPILER_MODULES`: a hit
#: never probes, and needs neither setuptools nor the C++ builder's first build. Checked
#: in tests/trainer/test_compile_cache.py: the probe imports nothing else.
PROBE_MODULES = (
    "torch._inductor.config",
    "torch._functorch.config",
    "torch._inductor.utils",
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.cpp_builder",
    "torch._inductor.codecache",
    "torch.utils.cpp_extension",
    "tomllib",  # stdlib, imported by the first build's setuptools
)


def import_compiler_modules(names: tuple[str, ...] = COMPILER_MODULES) -> None:
    """Import `names` (by default `COMPILER_MODULES`; a no-op once imported), after the
    import `start_compiler_import` began, if any, has ended: `activate` calls it first, so
    its breakdown shows what is left of the import apart from the work."""
    importer = _IMPORTER
    if importer is not None and importer.thread is not threading.current_thread():
        importer.thread.join()
    _import_all(names)


def _import_all(names: tuple[str, ...] = COMPILER_MODULES) -> None:
    for name in names:
        importlib.import_module(name)


@dataclass
class _Importer:
    """The thread `start_compiler_import` started, and when its import began and ended
    (`time.perf_counter`; `ended` None while it runs)."""

    thread: threading.Thread
    began: float
    ended: float | None = None
    error: str | None = None


_IMPORTER: _Importer | None = None
_IMPORTER_LOCK = threading.Lock()


def start_compiler_import() -> None:
    """Begin importing `COMPILER_MODULES` on a daemon thread (once a process), so that
    the import (seconds, most of a warm start: bench/RESULTS.md) can run while the
    caller waits without the GIL (a process group's rendezvous, checkpoint reads, device
    set-up); it holds the GIL itself, so beside pure Python it gains nothing.
    `activate` waits for it. Call it once the caller's own imports that reach into
    torch's compiler (torchrec's) are done: two threads importing the same cyclic
    packages can meet in a cycle of module locks, which Python breaks by failing one of
    the imports. A failure here is logged and left to `activate`, whose own import then
    raises it where it belongs."""
    global _IMPORTER
    with _IMPORTER_LOCK:
        if _IMPORTER is not None:
            return
        thread = threading.Thread(target=_import_ahead, name="ett-compiler-import",
                                  daemon=True)
        _IMPORTER = _Importer(thread, time.perf_counter())
        thread.start()


def _import_ahead() -> None:
    importer = _IMPORTER
    assert importer is not None
    try:
        _import_all()
    except BaseException as exc:  # activate imports again, on its thread, and raises
        importer.error = f"{type(exc).__name__}: {exc}"
        log.debug("compiler modules not imported ahead", exc_info=True)
    finally:
        importer.ended = time.perf_counter()


def compiler_import_ahead() -> tuple[float, float | None] | None:
    """When the import `start_compiler_import` began, and when it ended (None while it
    runs), as `time.perf_counter` values; None if it was never started."""
    importer = _IMPORTER
    return None if importer is None else (importer.began, importer.ended)


def set_process_wide(config_module: ModuleType, name: str, value: object) -> None:
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


def compiler_id() -> str:
    """The C++ compiler inductor will use, with its version line."""
    import subprocess

    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = get_cpp_compiler()
    done = subprocess.run([compiler, "--version"], capture_output=True, text=True,
                          timeout=30, check=False)
    first = done.stdout.splitlines()[0] if done.stdout else f"exit {done.returncode}"
    return f"{compiler}: {first}"


def point_inductor_at(local: Path) -> list[str]:
    """Set inductor's (and Triton's) cache dirs; return cache switches found off."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(local)
    os.environ["TRITON_CACHE_DIR"] = str(local / "triton")
    if "torch._inductor.utils" in sys.modules:
        from torch._inductor.utils import clear_caches

        clear_caches()

    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

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


#: The C++ header switch as torch (or its user) had it before `set_precompiled_headers`
#: first changed it in this process: what a cold compile uses.
_TORCH_HEADERS: bool | None = None


def torch_precompiled_headers() -> bool:
    """Whether torch precompiles C++ headers when left alone (on unless its user turned it
    off: `TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0`), as it was before this module
    first changed it."""
    global _TORCH_HEADERS
    if _TORCH_HEADERS is None:
        import torch._inductor.config as inductor_config

        _TORCH_HEADERS = bool(inductor_config.cpp_cache_precompile_headers)
    return _TORCH_HEADERS


def set_precompiled_headers(on: bool) -> None:
    """Turn inductor's C++ header precompiling on or off, for every thread."""
    import torch._inductor.config as inductor_config

    torch_precompiled_headers()  # remember torch's own setting first
    set_process_wide(inductor_config, "cpp_cache_precompile_headers", on)


#: The one definition in inductor's C++ build command that depends on the header switch.
PCH_DEFINE = "TORCH_INDUCTOR_PRECOMPILE_HEADERS"


def key_kernels_without_header_switch() -> bool:
    """Make inductor's C++ kernel build command, and so each kernel's key (the name of its
    built `.so`), the same whether headers are precompiled or not; True when in effect.

    In torch 2.13 every C++ build defines `TORCH_INDUCTOR_PRECOMPILE_HEADERS` when the
    switch is on (`cpp_builder._get_torch_cpp_wrapper_definition`), and `CppCodeCache`
    hashes the command line into the kernel's key. Only the C++ wrapper's headers read
    that definition (to include more for the precompiled header); a kernel's code does not.
    So, outside `cpp_wrapper` builds, it is left out: the kernels a cold process built with
    headers precompiled are the ones a warm process, headers off, looks up (checked by
    `tests/trainer/test_compile_cache.py`). Idempotent; False, with nothing changed, when
    torch's function is not what this expects (then both sides must keep the same switch).
    """
    try:
        import torch._inductor.config as inductor_config
        from torch._inductor import cpp_builder
    except ImportError:
        return False
    current = getattr(cpp_builder, "_get_torch_cpp_wrapper_definition", None)
    if current is None:
        log.warning("compile cache: torch's C++ build definitions moved; precompiled headers "
                    "stay off")
        return False
    if getattr(current, "_ett_header_free", False):
        return True

    def definitions() -> list[str]:
        defs: list[str] = current()
        if inductor_config.cpp_wrapper:  # the definition selects the wrapper's includes
            return defs
        return [d for d in defs if d != PCH_DEFINE]

    definitions._ett_header_free = True  # type: ignore[attr-defined]
    definitions.__wrapped__ = current  # type: ignore[attr-defined]
    cpp_builder._get_torch_cpp_wrapper_definition = definitions
    return True


@dataclass(frozen=True, slots=True)
class VecIsaRecord:
    """What a saver's CPU vector-ISA check found (`settle_vec_isa`), kept in the entry's
    manifest: whether the ISAs this CPU has (`isas`, inductor's names) all built with
    `compiler` (`compiler_id`)."""

    ok: bool
    isas: tuple[str, ...]
    compiler: str


def settle_vec_isa(recorded: VecIsaRecord | None) -> VecIsaRecord | None:
    """Skip inductor's CPU vector-ISA probe when the entry already answers it; return what
    a save records (None when nothing was checked).

    The probe builds and `dlopen`s a test library per candidate ISA in subprocesses
    (seconds per process: bench/RESULTS.md, "compile_cache.py: the figures behind its
    design"). Its answer
    depends on the CPU (in the cache key) and the C++ compiler (recorded in the
    entry). A saver that probed and found every ISA this CPU has buildable records
    that; a loader with the same candidate ISAs and compiler then sets inductor's own
    switch `cpp.vec_isa_ok = True` instead of probing. Otherwise it probes as inductor
    would and sets the switch only if the answer is the same. Saver and loader thus
    end with the same setting, which matters: the switch is part of the FX graph
    cache key. A user's explicit `TORCHINDUCTOR_VEC_ISA_OK` is left alone.

    All of it on the calling thread; `VecIsaSettle.begin(..., on_thread=True)` probes on a
    thread instead, with the same answer.
    """
    return VecIsaSettle.begin(recorded, on_thread=False).wait()


#: The settle begun on a thread whose answer inductor's next compile waits for
#: (`wait_for_vec_isa`); None once it is set.
_PENDING: VecIsaSettle | None = None
_PENDING_LOCK = threading.Lock()


def wait_for_vec_isa() -> VecIsaRecord | None:
    """Wait for the vector-ISA probe begun on a thread, if one is pending, and set its
    answer in inductor (`VecIsaSettle.wait`); what it found, or None. Inductor's compile
    entry point calls it first (`_wait_before_compiles`)."""
    pending = _PENDING
    return None if pending is None else pending.wait()


class VecIsaSettle:
    """`settle_vec_isa`'s work, begun by `begin` and ended by `wait`.

    `begin` decides on the calling thread whether there is anything to check (an x86 CPU,
    no explicit `TORCHINDUCTOR_VEC_ISA_OK`, candidate ISAs); the check itself (the C++
    compiler's version, then inductor's probe: a test build and load per candidate ISA,
    subprocesses all, run at once by `_check_each_at_once`) runs then and there, or on a
    daemon thread (`on_thread`), where it waits on gcc beside the caller's imports and
    dynamo's tracing without taking the GIL from them. `wait` joins it and sets the
    answer in inductor once (the switch for every thread, the environment for compile
    workers), on the thread that needs it: inductor's compile waits for it first (the
    switch is part of the FX graph and AOTAutograd cache keys), and so does
    `CompileCache.save`, which records it. A failed check is logged by `wait` as a
    warning and gives None, as a synchronous one did: no switch set, nothing recorded,
    the compile probes as inductor would.

    `timings` (a `CacheLoad.breakdown`) gets under `vec_isa` the seconds `begin` took and
    those `wait` waited for the thread (the probe's cost to the critical path), under
    `vec_isa_probe` the probe's own seconds on its thread, and under `import_compiler`
    the import of inductor's compile entry point that `begin` does beside the probe.
    """

    def __init__(self, recorded: VecIsaRecord | None, candidates: list[str] | None,
                 timings: dict[str, float] | None) -> None:
        self._recorded = recorded
        self._candidates = candidates
        self._timings = timings
        self._thread: threading.Thread | None = None
        self._answer: tuple[bool, str] | None = None  # (trusted, compiler)
        self._error: Exception | None = None
        self._lock = threading.Lock()
        self._settled = candidates is None
        self._record: VecIsaRecord | None = None
        self.began = time.perf_counter()
        self.ended: float | None = None if candidates is not None else self.began

    @classmethod
    def begin(cls, recorded: VecIsaRecord | None, *, on_thread: bool,
              timings: dict[str, float] | None = None) -> VecIsaSettle:
        """Begin settling the vector ISA (see the class). With `on_thread`, the probe's
        modules (`PROBE_MODULES`) are imported here first; once its thread has started,
        inductor's compiles are made to wait for it (`_wait_before_compiles`, which
        imports inductor's `compile_fx`, beside the probe; counted in `timings` as
        `import_compiler`, what it is); where they cannot be (torch moved its entry point),
        it is waited for here. A settle pending from earlier is waited for first: its
        answer may make this one unnecessary. Its own seconds go to `timings`' `vec_isa`."""
        start, gate_s = time.perf_counter(), 0.0
        wait_for_vec_isa()
        try:
            candidates = _candidate_isas()
        except Exception as exc:  # never fail a compile over an optimisation of it
            log.warning("compile cache: vector-ISA check skipped: %r", exc)
            candidates = None
        settle = cls(recorded, candidates, timings)
        try:
            if candidates is not None:
                gate_s = settle._begin(on_thread)
            return settle
        finally:
            if timings is not None:
                timings["vec_isa"] = (timings.get("vec_isa", 0.0)
                                      + time.perf_counter() - start - gate_s)
                if gate_s:
                    timings["import_compiler"] = timings.get("import_compiler", 0.0) + gate_s

    def _begin(self, on_thread: bool) -> float:
        """`begin`'s check, here or on a thread; the seconds the gate took to put in."""
        global _PENDING
        if on_thread:
            try:
                import_compiler_modules(PROBE_MODULES)
            except Exception as exc:
                log.warning("compile cache: vector-ISA probe not begun on a thread: %r", exc)
                on_thread = False
        if not on_thread:
            self._check()
            return 0.0
        self._thread = threading.Thread(target=self._check, name="ett-vec-isa-probe",
                                        daemon=True)
        with _PENDING_LOCK:
            _PENDING = self
        self.began = time.perf_counter()
        self._thread.start()
        try:
            gated = _wait_before_compiles()
        except Exception as exc:
            log.warning("compile cache: inductor's compiles cannot wait for the vector-ISA "
                        "probe (%r); waiting for it now", exc)
            gated = False
        gate_s = time.perf_counter() - self.began
        if not gated:  # the compile must not begin before its answer is set
            self._settle(self._join())
            return 0.0
        return gate_s

    @property
    def on_thread(self) -> bool:
        """Whether the check runs (or ran) on a thread of its own."""
        return self._thread is not None

    def _check(self) -> None:
        """The check: the recorded answer if it is this CPU's and compiler's, else the
        probe, as inductor would run it at its first CPU kernel."""
        try:
            from torch._inductor import cpu_vec_isa  # imported by `begin`: a lookup

            compiler = compiler_id()
            recorded, candidates = self._recorded, self._candidates or []
            trusted = (
                recorded is not None and recorded.ok
                and list(recorded.isas) == candidates and recorded.compiler == compiler
            )
            if not trusted:
                listed = getattr(cpu_vec_isa.valid_vec_isa_list, "cache_info", None)
                if listed is not None and listed().currsize == 0:  # not yet probed
                    _check_each_at_once(candidates)
                trusted = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] == candidates
            self._answer = (trusted, compiler)
        except Exception as exc:  # reported by `wait`, on the thread that needs it
            self._error = exc
        finally:
            self.ended = time.perf_counter()

    def wait(self) -> VecIsaRecord | None:
        """Wait for the check, set its answer in inductor (once), and return what a save
        records: None when nothing was checked or the check failed (a warning)."""
        waited = self._join()
        if self._timings is not None and self._thread is not None:
            with self._lock:
                self._timings["vec_isa"] = self._timings.get("vec_isa", 0.0) + waited
        return self._settle(waited)

    def _join(self) -> float:
        """Wait for the check's thread, if any; the seconds waited."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return 0.0
        start = time.perf_counter()
        thread.join()
        return time.perf_counter() - start

    def _settle(self, waited: float) -> VecIsaRecord | None:
        """Set the check's answer in inductor, once; what a save records."""
        global _PENDING
        with self._lock:
            if self._settled:
                return self._record
            self._settled = True
            with _PENDING_LOCK:
                if _PENDING is self:
                    _PENDING = None
            if self._thread is not None and self.ended is not None:
                probe = self.ended - self.began
                if self._timings is not None:
                    self._timings["vec_isa_probe"] = probe
                log.info("compile cache: vector-ISA probe %.2fs on its thread, %.2fs of it "
                         "waited for", probe, waited)
            self._record = self._apply()
            return self._record

    def _apply(self) -> VecIsaRecord | None:
        if self._error is not None or self._answer is None:
            error = self._error or RuntimeError("the vector-ISA probe gave no answer")
            log.warning("compile cache: vector-ISA check skipped: %r", error)
            return None
        trusted, compiler = self._answer
        assert self._candidates is not None
        try:
            if trusted:
                import torch._inductor.config as inductor_config

                set_process_wide(inductor_config, "cpp.vec_isa_ok", True)
                os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"  # compile worker processes
        except Exception as exc:
            log.warning("compile cache: vector-ISA check skipped: %r", exc)
            return None
        return VecIsaRecord(ok=trusted, isas=tuple(self._candidates), compiler=compiler)


def _check_each_at_once(candidates: list[str]) -> None:
    """Run inductor's check of each candidate ISA (`bool(isa)`: build its test program
    with gcc, `dlopen` it in a child Python; 2.5-3.7 s each on the 2-core machine) at
    once, one thread each, where `valid_vec_isa_list` runs them one after another: with
    a core each, the probe takes as long as its slowest ISA (9.5 s serial, 5.1 s so on
    2 cores). Inductor keeps each answer in its own per-ISA cache (`VecISA.__bool__`),
    which `valid_vec_isa_list` then reads; a check that fails here is left to it, which
    runs it again and raises where it would have."""
    from torch._inductor import cpu_vec_isa  # imported by `VecIsaSettle.begin`: a lookup

    isas = [isa for isa in cpu_vec_isa.supported_vec_isa_list if str(isa) in candidates]

    def check(isa: object) -> None:
        with contextlib.suppress(Exception):
            bool(isa)

    others = [threading.Thread(target=check, args=(isa,), name="ett-vec-isa-build",
                               daemon=True) for isa in isas[1:]]
    for thread in others:
        thread.start()
    for isa in isas[:1]:
        check(isa)
    for thread in others:
        thread.join()


def _candidate_isas() -> list[str] | None:
    """The ISAs inductor would probe on this CPU, or None when nothing is to be checked:
    not x86, the switch already set (by the user, or by an earlier `activate`), no
    candidate. Read on the calling thread: inductor's options are per thread."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa

    if inductor_config.cpp.vec_isa_ok is not None:
        return None
    flags = cpu_vec_isa.x86_isa_checker()
    candidates = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
                  if all(flag in flags for flag in str(isa).split())]
    return candidates or None


def _wait_before_compiles() -> bool:
    """Make inductor's compile entry point (`torch._inductor.compile_fx.compile_fx`, which
    torch.compile's inductor backend, jit or ahead of time, looks up on every call) wait
    for a pending vector-ISA probe first (`wait_for_vec_isa`): before dynamo's graph
    reaches AOTAutograd, whose cache key holds inductor's options, and long before
    inductor picks the ISA for its first C++ kernel. Idempotent; a pass-through once
    nothing is pending. False, with nothing changed, when torch's entry point moved."""
    module: Any = importlib.import_module("torch._inductor.compile_fx")
    current = getattr(module, "compile_fx", None)
    if current is None:
        log.warning("compile cache: inductor's compile_fx moved; the vector-ISA probe runs "
                    "before the compile")
        return False
    if getattr(current, "_ett_waits_for_vec_isa", False):
        return True

    @functools.wraps(current)
    def compile_fx(*args: object, **kwargs: object) -> object:
        wait_for_vec_isa()
        return current(*args, **kwargs)

    compile_fx._ett_waits_for_vec_isa = True  # type: ignore[attr-defined]
    module.compile_fx = compile_fx
    return True
