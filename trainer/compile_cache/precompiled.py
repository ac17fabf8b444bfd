"""Precompiled forwards: a module's forward compiled ahead of time with its guards, stored
in the entry and loaded on a warm start instead of traced again.

`CompileCache.precompile` installs a `PrecompiledForward` as the module's `forward`. It
loads the entry's serialized forward when there is one; otherwise its first call
compiles ahead of time (`torch.compile(fn, fullgraph=True).aot_compile`) and keeps the
serialized result for `CompileCache.save`. A call the loaded guards reject, or a module
that cannot be compiled as one full graph, runs `torch.compile` just in time instead,
with a warning: a stale or foreign entry costs a compile, never a wrong result. The
serialized forwards are pickles that torch's unpicklers load by importing what they name
(docs/security.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from airflow_ett.trainer.compile_cache.counters import PRECOMPILE_COUNTS, PRECOMPILE_SECONDS

if TYPE_CHECKING:
    import torch
    from torch._dynamo.aot_compile import AOTCompiledFunction

log = logging.getLogger(__name__)


class ArtifactLoader(Protocol):
    """What a forward needs of its `CompileCache`: the deferred artifacts, loaded before a
    just-in-time compile."""

    def load_deferred_artifacts(self) -> bool: ...


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

    def __init__(self, module: torch.nn.Module, name: str, cache: ArtifactLoader, *,
                 dynamic: bool, ahead: bool = True) -> None:
        self.name = name
        self._module = module
        self._fn: Callable[..., object] = type(module).forward
        self._cache = cache
        self._dynamic = dynamic
        self._aot: AOTCompiledFunction | None = None
        self._jit: Callable[..., object] | None = None
        self._tried_ahead = not ahead
        self._warned = False
        #: Compiled ahead of time in this process (not loaded): `needs_save`.
        self.compiled_here = False
        #: What `CompileCache.save` stores for this forward (loaded or compiled here).
        self.serialized: bytes | None = None
        #: Seconds `load` took (unpickling, kernel loading, guard build).
        self.load_seconds = 0.0

    def __reduce__(self) -> tuple[
            Callable[[Callable[..., object], torch.nn.Module], Callable[..., object]],
            tuple[Callable[..., object], torch.nn.Module]]:
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
        PRECOMPILE_COUNTS["loaded"] += 1
        return True

    def __call__(self, *args: object, **kwargs: object) -> object:
        module, aot = self._module, self._aot
        if aot is None and not self._tried_ahead:
            self._tried_ahead = True
            aot = self._aot = self._compile_ahead(args, kwargs)
        if aot is not None:
            if aot.guard_check(module, *args, **kwargs):
                return aot.fn(module, *args, **kwargs)
            if not self._warned:
                self._warned = True
                guards = aot._artifacts.guard_manager
                reason = guards.check_verbose(aot.prepare_f_locals(module, *args, **kwargs)) \
                    if guards is not None else "no guards"
                log.warning("compile cache: precompiled forward %s rejects this call (%s); "
                            "compiling it just in time", self.name, reason)
        return self._just_in_time(args, kwargs)

    def _compile_ahead(self, args: tuple[object, ...], kwargs: dict[str, object]
                       ) -> AOTCompiledFunction | None:
        """Compile on this call's arguments and serialize at once (what `save` stores).
        None, with a warning, when torch cannot (a graph break, an unserializable part)."""
        import torch
        from torch._dynamo.aot_compile import AOTCompiledFunction

        try:
            # torch types what compile returns as the plain function: no `aot_compile`
            wrapped: Any = torch.compile(self._fn, fullgraph=True, dynamic=self._dynamic)
            compiled: AOTCompiledFunction = wrapped.aot_compile(((self._module, *args), kwargs))
            start = time.perf_counter()
            self.serialized = AOTCompiledFunction.serialize(compiled).serialized_data
            PRECOMPILE_SECONDS["serialize"] += time.perf_counter() - start
            self.compiled_here = True
        except Exception as exc:
            log.warning("compile cache: forward %s cannot be compiled ahead of time (%s: %s); "
                        "compiling it just in time (the cache then keeps only kernels and "
                        "torch's artifacts for it)", self.name, type(exc).__name__, exc)
            return None
        PRECOMPILE_COUNTS["compiled"] += 1
        return compiled

    def _just_in_time(self, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        if self._jit is None:
            import torch

            self._cache.load_deferred_artifacts()
            self._jit = torch.compile(self._fn, dynamic=self._dynamic)
        PRECOMPILE_COUNTS["fallbacks"] += 1
        return self._jit(self._module, *args, **kwargs)


def _eager_forward(fn: Callable[..., object], module: torch.nn.Module) -> Callable[..., object]:
    """`fn` bound to `module`: what a pickled `PrecompiledForward` becomes."""
    import types

    return types.MethodType(fn, module)


# Entries pickle `_eager_forward` by name inside each precompiled forward (`__reduce__`,
# through dynamo's guards). The name they carry is the one it had before the package was
# split, which the package re-exports, so entries load whichever side of the split saved
# them.
_eager_forward.__module__ = "airflow_ett.trainer.compile_cache"
