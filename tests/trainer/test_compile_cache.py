"""The compile cache: keys, entries, activation, and (slow) real compiles in fresh processes.

Three tiers:

* pure `cache_key` tests (fast, no compile);
* entry mechanics against the real torch but without compiling: files stand in for
  inductor's output and `torch.compiler.save/load_cache_artifacts` are replaced by fakes
  where a test needs artifacts to exist (the real loader is used wherever a test checks
  that torch rejects garbage), so every kind of broken entry is checked in milliseconds;
* `integration`/`slow`: real `torch.compile` of a small MLP (forward, backward, SGD step)
  in fresh subprocesses (`airflow_ett.trainer.compile_probe`), since in-process caches
  would hide the effect. One cold process saves; its entry is shared by the rest.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
import logging
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import airflow_ett.trainer.cache_archive as cache_archive
import airflow_ett.trainer.compile_cache as cc
from airflow_ett.trainer.compile_cache import (
    MANIFEST_NAME,
    CacheLoad,
    CompileCache,
    cache_key,
    compile_counters,
    device_kind,
    format_counters,
    key_inputs,
)
from airflow_ett.trainer.compile_cache import entry as cc_entry
from airflow_ett.trainer.compile_cache import key as cc_key
from airflow_ett.trainer.compile_cache import store as cc_store
from airflow_ett.trainer.compile_cache.inductor_dir import walk_local
from tests.hostile import deep_json, dev_zero, fifo, huge
from tests.trainer.test_cache_archive import header_bomb

CONFIG: dict[str, Any] = {
    "tables": [{"name": "t0", "rows": 1000, "dim": 16}],
    "dense_arch": [64, 16],
    "over_arch": [64, 1],
    "batch": 256,
}


# ---------------------------------------------------------------------------------------
# cache_key
# ---------------------------------------------------------------------------------------


def test_cache_key_is_short_hex_and_deterministic() -> None:
    key = cache_key(CONFIG, "cpu")
    assert len(key) == 16
    int(key, 16)
    assert cache_key(CONFIG, "cpu") == key
    assert cache_key(json.loads(json.dumps(CONFIG)), "cpu") == key


def test_cache_key_ignores_mapping_order() -> None:
    reordered = {k: CONFIG[k] for k in reversed(list(CONFIG))}
    reordered["tables"] = [{"dim": 16, "rows": 1000, "name": "t0"}]
    assert cache_key(reordered, "cpu", {"b": 1, "a": 2}) == cache_key(
        CONFIG, "cpu", {"a": 2, "b": 1}
    )


def test_cache_key_is_the_same_in_another_process() -> None:
    """No hash randomisation or object ids leak into the key."""
    code = (
        "import json, sys; from airflow_ett.trainer.compile_cache import cache_key; "
        "print(cache_key(json.loads(sys.argv[1]), 'cpu', {'mode': 'default'}))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(CONFIG)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=120,
    )
    assert out.stdout.strip() == cache_key(CONFIG, "cpu", {"mode": "default"})


@pytest.mark.parametrize(
    "change",
    [
        "config value",
        "config key",
        "device kind",
        "extra",
        "torch version",
        "torch commit",
        "python version",
        "cpu capability",
        "cache format",
    ],
)
def test_cache_key_changes_with_what_invalidates_compiled_code(
    change: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = cache_key(CONFIG, "cpu")
    config, kind, extra = dict(CONFIG), "cpu", None
    if change == "config value":
        config["dense_arch"] = [64, 32]
    elif change == "config key":
        config["dropout"] = 0.0
    elif change == "device kind":
        kind = "cuda:9.0"
    elif change == "extra":
        extra = {"dynamic": True}
    elif change == "torch version":
        monkeypatch.setattr(torch, "__version__", "2.12.0+cpu")
    elif change == "torch commit":
        monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    elif change == "python version":
        monkeypatch.setattr(sys, "version_info", type("V", (), {"major": 3, "minor": 12})())
    elif change == "cpu capability":
        current = torch.backends.cpu.get_cpu_capability()
        other = "AVX2" if current != "AVX2" else "AVX512"
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    elif change == "cache format":
        monkeypatch.setattr(cc_key, "CACHE_FORMAT", cc.CACHE_FORMAT + 1)
    assert cache_key(config, kind, extra) != base


def test_cpu_capability_only_keys_cpu_entries() -> None:
    assert "cpu_capability" in key_inputs(CONFIG, "cpu")
    assert "cpu_capability" not in key_inputs(CONFIG, "cuda:9.0")


class _Mode(enum.Enum):
    FAST = "fast"


@dataclasses.dataclass
class _Table:
    rows: int


def test_cache_key_canonicalises_common_types_and_rejects_the_rest() -> None:
    config = {"path": Path("/a/b"), "mode": _Mode.FAST, "ids": {3, 1, 2}, "t": _Table(5)}
    as_json = {"path": "/a/b", "mode": "fast", "ids": [1, 2, 3], "t": {"rows": 5}}
    assert cache_key(config, "cpu") == cache_key(as_json, "cpu")
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        cache_key({"fn": object()}, "cpu")
    with pytest.raises(ValueError):
        cache_key({"x": float("nan")}, "cpu")


def test_device_kind() -> None:
    assert device_kind("cpu") == "cpu"
    assert device_kind(torch.device("cpu")) == "cpu"
    if not torch.cuda.is_available():
        assert device_kind() == "cpu"


def test_format_counters() -> None:
    counters = dict.fromkeys(compile_counters(), 0)
    counters.update(graphs=3, recompiles=1, fx_graph_cache_hits=2, fx_graph_cache_misses=4)
    assert format_counters(counters) == (
        "graphs 3, recompiles 1, graph breaks 0, cache hits 2/6 (aot 0/0)"
    )


def test_compile_counters_reports_ints() -> None:
    counters = compile_counters()
    assert set(counters) == {
        "graphs",
        "recompiles",
        "graph_breaks",
        "fx_graph_cache_hits",
        "fx_graph_cache_misses",
        "fx_graph_cache_bypasses",
        "aot_autograd_cache_hits",
        "aot_autograd_cache_misses",
        "precompiled_loaded",
        "precompiled_compiled",
        "precompiled_fallbacks",
    }
    assert all(isinstance(v, int) and v >= 0 for v in counters.values())


def test_format_counters_names_precompiled_forwards_only_when_there_are_some() -> None:
    counters = dict.fromkeys(compile_counters(), 0)
    counters.update(precompiled_loaded=3, precompiled_fallbacks=1)
    assert format_counters(counters).endswith(
        "(aot 0/0), precompiled loaded 3, compiled 0, just in time 1"
    )


def test_precompile_needs_activate_and_unique_names(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "root", local_dir=tmp_path / "local")
    module = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="call activate"):
        cache.precompile(module, "lin")
    cache.activate("k1")
    assert cc.active_cache() is cache
    assert cache.precompile(module, "lin") is False  # nothing in the (missing) entry
    with pytest.raises(ValueError, match="'lin' is empty or already used"):
        cache.precompile(torch.nn.Linear(2, 2), "lin")


def test_a_precompiled_forward_pickles_as_the_eager_forward(tmp_path: Path) -> None:
    """Dynamo pickles a module's attributes with its guards, and `deepcopy` does too: the
    copy must be a plain module, not one tied to this process's compile."""
    import copy

    cache = CompileCache(tmp_path / "root", local_dir=tmp_path / "local")
    cache.activate("k1")
    module = torch.nn.Linear(2, 2)
    cache.precompile(module, "lin")
    clone = copy.deepcopy(module)
    assert not isinstance(clone.forward, cc.PrecompiledForward)
    x = torch.ones(1, 2)
    assert torch.equal(clone(x), torch.nn.functional.linear(x, clone.weight, clone.bias))


def test_a_precompiled_forward_pickles_under_the_name_saved_entries_carry(
    tmp_path: Path,
) -> None:
    """Saved precompiled forwards name the eager forward by the package's path (as before
    the module became a package), so an entry loads whichever side of the split saved it."""
    import pickle

    cache = CompileCache(tmp_path / "root", local_dir=tmp_path / "local")
    cache.activate("k1")
    module = torch.nn.Linear(2, 2)
    cache.precompile(module, "lin")
    eager, _ = module.forward.__reduce__()
    assert (eager.__module__, eager.__qualname__) == (
        "airflow_ett.trainer.compile_cache", "_eager_forward")
    restored = pickle.loads(pickle.dumps(module.forward))  # the name resolves both ways
    x = torch.ones(1, 2)
    assert torch.equal(restored(x), module.forward._fn(module, x))


def _write_precompiled(entry: Path, blob: bytes, forwards: dict[str, Any]) -> None:
    """A precompiled part holding `blob`, indexed by `forwards`, with its true size and
    checksum in the manifest (what it holds is each test's own business)."""
    import hashlib

    (entry / "precompiled-x.bin").write_bytes(blob)
    _rewrite_manifest(entry, precompiled={
        "file": "precompiled-x.bin", "size": len(blob),
        "sha256": hashlib.sha256(blob).hexdigest(), "forwards": forwards,
    })


@pytest.mark.parametrize(
    "index",
    [
        {},
        {"m": {"offset": 0, "size": 10_000}},
        {"m": {"offset": -1, "size": 1}},
        {"m": [0, 1]},
    ],
)
def test_a_bad_precompiled_index_drops_that_part_alone(
    tmp_path: Path, fake_artifacts: list[bytes], index: dict[str, Any]
) -> None:
    root, entry = _make_entry(tmp_path)
    _write_precompiled(entry, b"not a pickle", index)
    load = CompileCache(root, local_dir=tmp_path / "reader").activate("k1")
    assert (load.hit, load.artifacts_loaded, load.inductor_dir_restored) == (True, True, True)
    assert load.precompiled == () and not load.artifacts_deferred
    assert load.reason is not None and "precompiled forwards not read" in load.reason


def test_a_forward_the_saver_could_not_precompile_is_not_tried_again(
    tmp_path: Path, fake_artifacts: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, entry = _make_entry(tmp_path)
    _rewrite_manifest(entry, jit_forwards=["lin"])
    calls: list[str] = []

    def ahead(self: cc.PrecompiledForward, args: Any, kwargs: Any) -> None:
        calls.append("ahead")

    def jit(self: cc.PrecompiledForward, args: Any, kwargs: Any) -> Any:
        calls.append("jit")
        return self._fn(self._module, *args, **kwargs)

    monkeypatch.setattr(cc.PrecompiledForward, "_compile_ahead", ahead)
    monkeypatch.setattr(cc.PrecompiledForward, "_just_in_time", jit)
    cache = CompileCache(root, local_dir=tmp_path / "reader")
    cache.activate("k1")
    lin, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    cache.precompile(lin, "lin")
    cache.precompile(other, "other")
    lin(torch.ones(1, 2))
    assert calls == ["jit"]
    other(torch.ones(1, 2))
    assert calls == ["jit", "ahead", "jit"]  # not in jit_forwards: tried ahead first
    assert not cache.needs_save()  # nothing was compiled ahead of time here


def test_precompiled_forwards_defer_the_artifacts_until_a_jit_compile(
    tmp_path: Path, fake_artifacts: list[bytes]
) -> None:
    root, entry = _make_entry(tmp_path)
    _write_precompiled(entry, b"two forwards",
                       {"a": {"offset": 0, "size": 3}, "b": {"offset": 4, "size": 8}})
    loads_before = len(fake_artifacts)
    cache = CompileCache(root, local_dir=tmp_path / "reader")
    load = cache.activate("k1")
    assert load.precompiled == ("a", "b") and load.artifacts_deferred and load.reason is None
    assert not load.artifacts_loaded and len(fake_artifacts) == loads_before
    assert set(load.breakdown) >= {"import_compiler", "manifest", "archive", "vec_isa"}
    assert cache.load_deferred_artifacts() is True
    assert cache.load_deferred_artifacts() is False  # once
    eager = CompileCache(root, local_dir=tmp_path / "eager", defer_artifacts=False).activate("k1")
    assert eager.artifacts_loaded and not eager.artifacts_deferred


# ---------------------------------------------------------------------------------------
# Entries, without compiling
# ---------------------------------------------------------------------------------------

FILES = {
    "fxgraph/ab/entry": b"fx" * 500,
    "aotautograd/cd/entry": b"aot" * 100,
    "ab/kernel.cpp": b"int main() {}\n",
    "ab/kernel.so": os.urandom(4096),
}


@pytest.fixture(autouse=True)
def _restore_inductor_settings() -> Iterator[None]:
    """`activate` sets process-wide state; give it back after each test.

    The environment by hand: `monkeypatch.delenv` of a variable that is not set records
    nothing to undo, so one that `activate` sets later would leak into every later test
    and into the subprocesses they start."""
    import torch._inductor.config as inductor_config

    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_VEC_ISA_OK")
    saved_env = {name: os.environ.get(name) for name in names}
    # Not monkeypatch.setattr: its undo deletes and re-sets, and torch's config module
    # hides a deleted option for good ("... does not exist"). activate() also changes the
    # option's default (for other threads), so that is put back too.
    entry = inductor_config._config["cpp_cache_precompile_headers"]  # type: ignore[attr-defined]
    value, default = inductor_config.cpp_cache_precompile_headers, entry.default
    isa_entry = inductor_config._config["cpp.vec_isa_ok"]  # type: ignore[attr-defined]
    isa_value, isa_default = inductor_config.cpp.vec_isa_ok, isa_entry.default
    active = cc_store._ACTIVE  # what compile_dense compiles through, in this process
    yield
    cc.inductor.wait_for_vec_isa()  # a probe a miss began on a thread: its settings too
    cc_store._ACTIVE = active
    for name, saved in saved_env.items():
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved
    entry.default = default
    inductor_config.cpp_cache_precompile_headers = value
    isa_entry.default = isa_default
    inductor_config.cpp.vec_isa_ok = isa_value
    if "torch._inductor.utils" in sys.modules:
        from torch._inductor.utils import clear_caches

        clear_caches()


@pytest.fixture
def fake_artifacts(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Fake torch's portable artifacts: save returns b"good:<n>", load accepts only those.

    Returns the list of blobs loaded, in order.
    """
    from torch.compiler._cache import CacheInfo

    loaded: list[bytes] = []
    count = iter(range(1_000_000))

    def save() -> tuple[bytes, Any]:
        info = CacheInfo()
        info.artifacts["inductor"].append("k")
        return f"good:{next(count)}".encode(), info

    def load(blob: bytes) -> Any:
        if not blob.startswith(b"good:"):
            return None
        loaded.append(blob)
        return CacheInfo()

    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", save)
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", load)
    return loaded


def _write_files(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _read_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def _archivable(local: Path) -> dict[str, bytes]:
    """What a save of `local` archives: FILES, plus whatever inductor's vector-ISA probe
    built there when this is the process's first `activate` (a test run alone)."""
    return {name: path.read_bytes() for path, name in walk_local(local)}


def _make_entry(
    tmp: Path, key: str = "k1", files: dict[str, bytes] = FILES, name: str = "saver"
) -> tuple[Path, Path]:
    """A saved entry under tmp/root from a local dir holding `files`; (root, entry)."""
    cache = CompileCache(tmp / "root", local_dir=tmp / name)
    cache.activate(key)
    _write_files(tmp / name, files)
    return tmp / "root", cache.save(key)


def _manifest(entry: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((entry / MANIFEST_NAME).read_text())
    return data


def _rewrite_manifest(entry: Path, **changes: Any) -> None:
    (entry / MANIFEST_NAME).write_text(json.dumps({**_manifest(entry), **changes}))


def _replace_payload(entry: Path, part: str, data: bytes, *, fix_checksum: bool) -> None:
    """Overwrite a payload; with fix_checksum the manifest vouches for the new bytes."""
    import hashlib

    manifest = _manifest(entry)
    (entry / manifest[part]["file"]).write_bytes(data)
    if fix_checksum:
        manifest[part].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
        (entry / MANIFEST_NAME).write_text(json.dumps(manifest))


def test_activate_points_inductor_at_the_local_dir_with_torch_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch (and inductor's memoised lookups) are loaded before the key is known."""
    import tempfile

    import torch._inductor.config as inductor_config
    from torch._inductor.codecache import CacheBase
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cache = CompileCache(tmp_path / "root")
    CacheBase.get_local_cache_path()  # memoise a path under whatever dir was set before

    cache.activate("key-a")
    local_a = tmp_path / "tmp" / f"airflow-ett-inductor-{os.geteuid()}" / "key-a"
    assert cache_dir() == str(local_a)
    assert os.environ["TRITON_CACHE_DIR"] == str(local_a / "triton")
    assert CacheBase.get_local_cache_path().is_relative_to(local_a)
    # a miss: a cold compile, with torch's setting (on, unless its user turned it off)
    assert inductor_config.cpp_cache_precompile_headers is cc.inductor.torch_precompiled_headers()

    cache.activate("key-b")  # a second key in the same process follows too
    local_b = local_a.parent / "key-b"
    assert cache_dir() == str(local_b)
    assert CacheBase.get_local_cache_path().is_relative_to(local_b)


def test_a_shared_default_local_dir_is_never_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_artifacts: list[bytes]
) -> None:
    """$TMPDIR is shared by every user of a host and inductor loads the `.so` files in its
    cache dir: a default base dir that others can write (planted before this user's first
    job) is refused, and the compile goes to a fresh private dir, with the reason."""
    root, _ = _make_entry(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    planted = tmp_path / "tmp" / f"airflow-ett-inductor-{os.geteuid()}"
    (planted / "k1" / "ab").mkdir(parents=True)
    (planted / "k1" / "ab" / "kernel.so").write_bytes(b"planted")
    planted.chmod(0o777)
    load = CompileCache(root).activate("k1")
    assert load.reason is not None and "is not private to this user" in load.reason
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    used = Path(cache_dir())
    assert not used.is_relative_to(planted)
    assert stat.S_IMODE(used.stat().st_mode) == 0o700
    assert (used / "ab" / "kernel.so").read_bytes() == FILES["ab/kernel.so"]  # restored
    planted.chmod(0o700)
    assert CompileCache(root).activate("k1").reason is None  # private again: used
    assert Path(cache_dir()) == planted / "k1"


def test_settings_reach_a_compile_on_another_thread(
    tmp_path: Path, fake_artifacts: list[bytes]
) -> None:
    """Inductor config assignments are per thread (ContextVar) in torch 2.13."""
    import torch._inductor.config as inductor_config

    root, _ = _make_entry(tmp_path)
    assert CompileCache(root, local_dir=tmp_path / "l").activate("k1").hit  # headers off
    seen: list[bool] = []
    thread = threading.Thread(
        target=lambda: seen.append(inductor_config.cpp_cache_precompile_headers)
    )
    thread.start()
    thread.join()
    assert seen == [False]


def test_precompiled_headers_can_be_left_on(tmp_path: Path) -> None:
    import torch._inductor.config as inductor_config

    inductor_config.cpp_cache_precompile_headers = True
    CompileCache(
        tmp_path / "root", local_dir=tmp_path / "l", cpu_precompiled_headers=True
    ).activate("k")
    assert inductor_config.cpp_cache_precompile_headers is True


HEADERS, FREE = "cpp_cache_precompile_headers", "kernel_keys_without_header_switch"


def test_a_miss_compiles_with_headers_precompiled_and_a_hit_without(
    tmp_path: Path, fake_artifacts: list[bytes]
) -> None:
    """A cold compile as torch makes it (header precompiling on: each kernel build reads
    one prebuilt header), recorded in the manifest; a warm process loads the entry with
    them off (it would rebuild them on a fresh host before looking for a kernel): the
    kernels are keyed without the switch, so the cold side's are the warm side's."""
    import torch._inductor.config as inductor_config

    root, entry = _make_entry(tmp_path)  # activate (a miss), then save
    assert _manifest(entry)["settings"] == {
        HEADERS: cc.inductor.torch_precompiled_headers(), FREE: True}
    load = CompileCache(root, local_dir=tmp_path / "reader").activate("k1")
    assert load.hit and load.reason is None
    assert inductor_config.cpp_cache_precompile_headers is False


@pytest.mark.parametrize(("mode", "recorded", "usable"), [
    # the default: a hit loads with headers off
    (None, {HEADERS: False}, True),  # saved before the switch was left out: off, so never in
    (None, {HEADERS: True, FREE: True}, True),
    (None, {HEADERS: True}, False),  # on and keyed on it: every kernel would be rebuilt
    (None, {}, False),
    # a fixed switch (a caller compiling with torch.compile: FX graph cache keys on it)
    (False, {HEADERS: True, FREE: True}, False),
    (False, {HEADERS: False, FREE: True}, True),
    (True, {HEADERS: True, FREE: True}, True),
    (True, {HEADERS: True}, False),
    (True, {HEADERS: False, FREE: True}, False),
])
def test_a_loader_takes_the_entries_whose_kernels_it_finds(
    tmp_path: Path, fake_artifacts: list[bytes], mode: bool | None, recorded: dict[str, bool],
    usable: bool,
) -> None:
    root, entry = _make_entry(tmp_path)
    _rewrite_manifest(entry, settings=recorded)
    load = CompileCache(root, local_dir=tmp_path / "reader",
                        cpu_precompiled_headers=mode).activate("k1")
    assert load.hit is usable, load.reason
    assert usable or (load.reason is not None and "inductor settings" in load.reason)


def test_kernels_are_keyed_the_same_with_headers_precompiled_or_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`CppCodeCache` hashes a kernel's build command into its key (its `.so` name). In
    torch 2.13 the command defines TORCH_INDUCTOR_PRECOMPILE_HEADERS when the switch is
    on; once `key_kernels_without_header_switch` is in effect it does so only for a C++
    wrapper build (whose headers read it), so a warm process (off) finds the kernels a
    cold one (on) built."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder
    from torch._inductor.codecache import CppPythonBindingsCodeCache
    from torch._inductor.cpu_vec_isa import invalid_vec_isa

    definitions = cpp_builder._get_torch_cpp_wrapper_definition
    monkeypatch.setattr(cpp_builder, "_get_torch_cpp_wrapper_definition",
                        getattr(definitions, "__wrapped__", definitions))  # torch's own

    def command(headers: bool, wrapper: bool = False) -> str:
        with inductor_config.patch(cpp_cache_precompile_headers=headers, cpp_wrapper=wrapper):
            options = cpp_builder.CppTorchDeviceOptions(
                vec_isa=invalid_vec_isa, device_type="cpu", min_optimize=True,
                **CppPythonBindingsCodeCache.cpp_compile_command_flags)
            line: str = cpp_builder.CppBuilder(name="o", sources="i",
                                               BuildOption=options).get_command_line()
            return line

    assert command(True) != command(False)  # torch's: keyed on the switch
    assert cc.inductor.key_kernels_without_header_switch() is True
    assert cc.inductor.key_kernels_without_header_switch() is True  # once
    assert command(True) == command(False)
    assert cc.inductor.PCH_DEFINE in command(True, wrapper=True)
    assert cc.inductor.PCH_DEFINE not in command(False, wrapper=True)


def test_the_compiler_import_begun_ahead_is_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """`start_compiler_import` starts one daemon thread a process; the import `activate`
    opens with (`import_compiler_modules`) waits for it to end, then finds it done."""
    inductor = cc.inductor
    release = threading.Event()
    calls: list[str] = []

    def slow_import(names: tuple[str, ...] = cc.COMPILER_MODULES) -> None:
        calls.append(threading.current_thread().name)
        release.wait(10)

    monkeypatch.setattr(inductor, "_IMPORTER", None)
    monkeypatch.setattr(inductor, "_import_all", slow_import)
    assert cc.compiler_import_ahead() is None
    cc.start_compiler_import()
    cc.start_compiler_import()  # once a process
    importer = inductor._IMPORTER
    assert importer is not None and importer.thread.daemon
    assert importer.thread.name == "ett-compiler-import"
    waiting = threading.Thread(target=cc.import_compiler_modules, name="activate")
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and cc.compiler_import_ahead() == (importer.began, None)
    release.set()
    waiting.join(10)
    assert not waiting.is_alive() and not importer.thread.is_alive()
    assert calls == ["ett-compiler-import", "activate"]
    assert importer.ended is not None and importer.ended >= importer.began


def test_a_compiler_import_that_failed_ahead_fails_in_activate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inductor = cc.inductor

    def broken(names: tuple[str, ...] = cc.COMPILER_MODULES) -> None:
        raise ImportError("no inductor here")

    monkeypatch.setattr(inductor, "_IMPORTER", None)
    monkeypatch.setattr(inductor, "_import_all", broken)
    cc.start_compiler_import()
    importer = inductor._IMPORTER
    assert importer is not None
    importer.thread.join(10)
    assert importer.error == "ImportError: no inductor here"
    with pytest.raises(ImportError, match="no inductor here"):
        cc.import_compiler_modules()


class FakeIsaProbe:
    """Inductor's vector-ISA probe faked (`fake_isa_probe`): candidates avx2 and avx512,
    compiler "cc: 1"; each probe call is recorded with its thread's name and waits for
    `release` (set unless a test clears it); `fail` makes it raise."""

    CANDIDATES = ("avx2", "avx512")

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.fail: Exception | None = None
        self.compiles: list[tuple[str, object]] = []  # (thread, vec_isa_ok) per compile

    def valid_vec_isa_list(self) -> list[str]:
        self.calls.append(threading.current_thread().name)
        assert self.release.wait(10)
        if self.fail is not None:
            raise self.fail
        return list(self.CANDIDATES)

    def compile_fx(self, *args: object, **kwargs: object) -> str:
        import torch._inductor.config as inductor_config

        self.compiles.append((threading.current_thread().name, inductor_config.cpp.vec_isa_ok))
        return "compiled"


@pytest.fixture
def fake_isa_probe(monkeypatch: pytest.MonkeyPatch) -> FakeIsaProbe:
    """The probe faked on any CPU, inductor's switch unset, and inductor's compile entry
    point a fake that records the switch it sees (put back after the test)."""
    import torch._inductor.compile_fx as compile_fx_module
    import torch._inductor.config as inductor_config
    from torch._inductor import cpu_vec_isa

    fake = FakeIsaProbe()

    def candidates() -> list[str] | None:
        return None if inductor_config.cpp.vec_isa_ok is not None else list(fake.CANDIDATES)

    os.environ.pop("TORCHINDUCTOR_VEC_ISA_OK", None)  # the autouse fixture puts it back
    inductor_config._config["cpp.vec_isa_ok"].default = None  # type: ignore[attr-defined]
    inductor_config.cpp.vec_isa_ok = None
    monkeypatch.setattr(cc.inductor, "_candidate_isas", candidates)
    monkeypatch.setattr(cc.inductor, "compiler_id", lambda: "cc: 1")
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", fake.valid_vec_isa_list)
    monkeypatch.setattr(compile_fx_module, "compile_fx", fake.compile_fx)
    return fake


def test_a_miss_probes_the_vector_isa_on_a_thread_and_the_compile_waits_for_it(
    tmp_path: Path, fake_isa_probe: FakeIsaProbe, fake_artifacts: list[bytes]
) -> None:
    """The probe runs on its own thread, begun in activate; inductor's compile waits for
    it and sees the switch set; the breakdown has the wait; save records the answer,
    the one a synchronous probe gives."""
    import torch._inductor.compile_fx as compile_fx_module
    import torch._inductor.config as inductor_config

    fake = fake_isa_probe
    fake.release.clear()
    cache = CompileCache(tmp_path / "root", local_dir=tmp_path / "local")
    load = cache.activate("k1")
    assert not load.hit and "no entry" in (load.reason or "")
    pending = cc.inductor._PENDING
    assert pending is not None and pending.on_thread
    assert inductor_config.cpp.vec_isa_ok is None  # not set before the compile needs it
    compiling = threading.Thread(target=compile_fx_module.compile_fx, args=("gm", []),
                                 name="compile")
    compiling.start()
    compiling.join(0.3)
    assert compiling.is_alive() and fake.compiles == []  # waiting for the probe
    fake.release.set()
    compiling.join(10)
    assert fake.calls == ["ett-vec-isa-probe"]
    assert fake.compiles == [("compile", True)]
    assert os.environ["TORCHINDUCTOR_VEC_ISA_OK"] == "1"
    assert cc.inductor._PENDING is None
    assert load.breakdown["vec_isa"] >= 0.25 and load.breakdown["vec_isa_probe"] >= 0.25
    compile_fx_module.compile_fx("gm", [])  # then a pass-through
    assert len(fake.compiles) == 2 and fake.calls == ["ett-vec-isa-probe"]

    recorded = _manifest(cache.save("k1"))["vec_isa"]
    assert recorded == {"ok": True, "isas": ["avx2", "avx512"], "compiler": "cc: 1"}
    inductor_config._config["cpp.vec_isa_ok"].default = None  # type: ignore[attr-defined]
    inductor_config.cpp.vec_isa_ok = None
    synchronous = cc.inductor.settle_vec_isa(None)
    assert fake.calls == ["ett-vec-isa-probe", "MainThread"]
    assert synchronous is not None and dataclasses.asdict(synchronous) == {
        **recorded, "isas": tuple(recorded["isas"])}


def test_a_vector_isa_probe_that_fails_on_its_thread_is_the_warning_it_was(
    tmp_path: Path, fake_isa_probe: FakeIsaProbe, fake_artifacts: list[bytes],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed probe is reported once its answer is needed, as a synchronous one was: a
    warning, no switch set, nothing recorded; the compile goes on."""
    import torch._inductor.compile_fx as compile_fx_module
    import torch._inductor.config as inductor_config

    fake_isa_probe.fail = OSError("no compiler")
    cache = CompileCache(tmp_path / "root", local_dir=tmp_path / "local")
    with caplog.at_level(logging.INFO, logger=cc.__name__):
        cache.activate("k1")
        assert compile_fx_module.compile_fx("gm", []) == "compiled"
        entry = cache.save("k1")
    skipped = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert skipped == ["compile cache: vector-ISA check skipped: OSError('no compiler')"]
    assert fake_isa_probe.calls == ["ett-vec-isa-probe"]
    assert fake_isa_probe.compiles == [("MainThread", None)]
    assert inductor_config.cpp.vec_isa_ok is None
    assert "TORCHINDUCTOR_VEC_ISA_OK" not in os.environ
    assert _manifest(entry)["vec_isa"] is None
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=cc.__name__):
        assert cc.inductor.settle_vec_isa(None) is None  # the synchronous probe's warning
    assert [r.getMessage() for r in caplog.records] == skipped


def test_the_probe_checks_each_candidate_isa_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's per-ISA checks, one after another in `valid_vec_isa_list`, run at once,
    one thread each; only the candidates are checked."""
    from torch._inductor import cpu_vec_isa

    seen: list[tuple[str, int]] = []
    started = threading.Barrier(3, timeout=10)  # all three at once, or it breaks

    class Isa:
        def __init__(self, name: str) -> None:
            self.name = name

        def __str__(self) -> str:
            return self.name

        def __bool__(self) -> bool:
            started.wait()  # raises (and the check is left out) unless all three run at once
            seen.append((self.name, threading.get_ident()))
            return True

    monkeypatch.setattr(cpu_vec_isa, "supported_vec_isa_list",
                        [Isa("a"), Isa("b"), Isa("c"), Isa("not on this cpu")])
    cc.inductor._check_each_at_once(["a", "b", "c"])
    assert sorted(name for name, _ in seen) == ["a", "b", "c"]
    assert len({thread for _, thread in seen}) == 3


def test_a_hit_answers_the_vector_isa_check_without_a_probe_or_a_thread(
    tmp_path: Path, fake_isa_probe: FakeIsaProbe, fake_artifacts: list[bytes]
) -> None:
    import torch._inductor.config as inductor_config

    root, entry = _make_entry(tmp_path)  # a miss: probed once, on the thread
    assert fake_isa_probe.calls == ["ett-vec-isa-probe"]
    assert _manifest(entry)["vec_isa"]["ok"] is True
    inductor_config._config["cpp.vec_isa_ok"].default = None  # type: ignore[attr-defined]
    inductor_config.cpp.vec_isa_ok = None
    os.environ.pop("TORCHINDUCTOR_VEC_ISA_OK")
    threads = set(threading.enumerate())
    load = CompileCache(root, local_dir=tmp_path / "reader").activate("k1")
    assert load.hit and fake_isa_probe.calls == ["ett-vec-isa-probe"]  # no probe again
    assert cc.inductor._PENDING is None and set(threading.enumerate()) <= threads
    assert inductor_config.cpp.vec_isa_ok is True and "vec_isa_probe" not in load.breakdown


def test_miss_without_entry(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = CompileCache(tmp_path / "nowhere", local_dir=tmp_path / "local")
    assert not cache.has("k1")
    with caplog.at_level(logging.INFO, logger=cc.__name__):
        load = cache.activate("k1")
    assert load == CacheLoad("k1", False, False, False, load.seconds, load.reason)
    assert load.reason is not None and "no entry" in load.reason
    assert not any(r.levelno >= logging.WARNING for r in caplog.records)


def test_save_then_activate_restores_both_parts(
    tmp_path: Path, fake_artifacts: list[bytes]
) -> None:
    extra = {"locks/ab.lock": b"", "ab/.x.123.tmp": b"half", "ab/y.lock": b""}
    root, entry = _make_entry(tmp_path, files={**FILES, **extra})
    assert entry == root / "k1"
    manifest = _manifest(entry)
    assert manifest["key"] == "k1" and manifest["torch"] == torch.__version__
    for part in ("artifacts", "inductor_dir"):
        payload = entry / manifest[part]["file"]
        assert payload.stat().st_size == manifest[part]["size"]
        assert len(manifest[part]["sha256"]) == 64
    saved = _archivable(tmp_path / "saver")
    assert FILES.items() <= saved.items()
    assert manifest["inductor_dir"]["files"] == len(saved)
    assert not [p for p in entry.iterdir() if p.name.startswith(".")]

    reader = CompileCache(root, local_dir=tmp_path / "reader")
    assert reader.has("k1")
    load = reader.activate("k1")
    assert (load.hit, load.artifacts_loaded, load.inductor_dir_restored) == (True, True, True)
    assert load.reason is None
    assert _read_files(tmp_path / "reader") == saved  # no locks, no temp files
    assert fake_artifacts == [b"good:0"]


def test_restore_works_on_a_python_without_tarfile_filters(
    tmp_path: Path, fake_artifacts: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian 12's Python 3.11.2 has no extraction filters (3.11.4): `extractall` takes no
    `filter` keyword. The inductor dir must still be restored there, not only the
    artifacts (which alone leave a warm compile almost cold on CPU)."""
    import tarfile

    real = tarfile.TarFile.extractall

    def extractall_3112(self: tarfile.TarFile, path: Any = ".", members: Any = None,
                        *, numeric_owner: bool = False, **kwargs: Any) -> None:
        if kwargs:
            raise TypeError(f"TarFile.extractall() got an unexpected keyword argument {kwargs}")
        real(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall_3112)
    monkeypatch.setattr(cache_archive, "_HAS_DATA_FILTER", False)
    root, _ = _make_entry(tmp_path)
    load = CompileCache(root, local_dir=tmp_path / "reader").activate("k1")
    assert (load.hit, load.artifacts_loaded, load.inductor_dir_restored) == (True, True, True)
    assert load.reason is None
    assert _read_files(tmp_path / "reader") == _archivable(tmp_path / "saver")
    assert FILES.items() <= _read_files(tmp_path / "reader").items()


def test_restore_into_a_used_local_dir_keeps_what_is_there(
    tmp_path: Path, fake_artifacts: list[bytes]
) -> None:
    root, _ = _make_entry(tmp_path)
    local = tmp_path / "reader"
    _write_files(local, {"ab/kernel.cpp": b"mine", "zz/other": b"other"})
    load = CompileCache(root, local_dir=local).activate("k1")
    assert load.inductor_dir_restored
    assert _read_files(local) == {**FILES, "ab/kernel.cpp": b"mine", "zz/other": b"other"}
    assert not [p for p in local.parent.iterdir() if ".restore-" in p.name]


def test_artifacts_only(tmp_path: Path, fake_artifacts: list[bytes]) -> None:
    root, _ = _make_entry(tmp_path)
    local = tmp_path / "reader"
    load = CompileCache(root, local_dir=local, restore_inductor_dir=False).activate("k1")
    assert (load.hit, load.artifacts_loaded, load.inductor_dir_restored) == (True, True, False)
    assert load.reason is None
    assert _read_files(local) == {}


def test_entry_without_artifacts_still_restores_the_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)
    root, entry = _make_entry(tmp_path)
    assert _manifest(entry)["artifacts"] is None
    load = CompileCache(root, local_dir=tmp_path / "reader").activate("k1")
    assert (load.hit, load.artifacts_loaded, load.inductor_dir_restored) == (True, False, True)
    assert load.reason is not None and "no portable artifacts" in load.reason


def test_save_needs_activate_and_keys_are_checked(tmp_path: Path) -> None:
    cache = CompileCache(tmp_path / "root", local_dir=tmp_path / "l")
    with pytest.raises(RuntimeError, match="activate"):
        cache.save("k1")
    cache.activate("k1")
    with pytest.raises(RuntimeError, match="activate"):
        cache.save("k2")
    for bad in ("", "../up", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="bad compile cache key"):
            cache.has(bad)


def _truncate_archive(entry: Path) -> None:
    path = entry / _manifest(entry)["inductor_dir"]["file"]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_archive_bytes(entry: Path) -> None:
    path = entry / _manifest(entry)["inductor_dir"]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _escaping_tar() -> bytes:
    """A valid tar.gz whose second member would land three levels above the local dir."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in ("ab/kernel.cpp", "ab/../../../escaped.so"):
            info = tarfile.TarInfo(name)
            info.size = 4
            tar.addfile(info, io.BytesIO(b"\x7fELF"))
    return buf.getvalue()


def _swap(path: Path, make: Callable[[Path], str]) -> None:
    """Replace the file at `path` by a hostile one (tests/hostile.py)."""
    path.unlink()
    make(path)


def _break_both(entry: Path) -> None:
    _truncate_archive(entry)
    _replace_payload(entry, "artifacts", b"garbage", fix_checksum=False)


BROKEN: dict[str, tuple[Callable[[Path], object], tuple[bool, bool, bool], str]] = {
    # name: (how to break the entry, (hit, artifacts_loaded, dir_restored), reason contains)
    "truncated archive": (_truncate_archive, (True, True, False), "truncated"),
    "flipped archive byte": (_flip_archive_bytes, (True, True, False), "checksum"),
    "archive that is not a tar": (
        lambda e: _replace_payload(e, "inductor_dir", b"not a tar", fix_checksum=True),
        (True, True, False),
        "archive unreadable",
    ),
    "garbage artifacts in place": (
        lambda e: _replace_payload(e, "artifacts", b"garbage", fix_checksum=False),
        (True, False, True),
        "artifacts not loaded",
    ),
    "garbage artifacts torch rejects": (
        lambda e: _replace_payload(e, "artifacts", b"garbage" * 20, fix_checksum=True),
        (True, False, True),
        "could not deserialise",
    ),
    "artifacts file missing": (
        lambda e: (e / _manifest(e)["artifacts"]["file"]).unlink(),
        (True, False, True),
        "missing",
    ),
    "both parts broken": (
        _break_both,
        (False, False, False),
        "inductor dir not restored",
    ),
    "truncated manifest": (
        lambda e: (e / MANIFEST_NAME).write_text((e / MANIFEST_NAME).read_text()[:40]),
        (False, False, False),
        "not valid JSON",
    ),
    "manifest of another torch": (
        lambda e: _rewrite_manifest(e, torch="2.0.0"),
        (False, False, False),
        "version mismatch",
    ),
    "manifest naming another key": (
        lambda e: _rewrite_manifest(e, key="k2"),
        (False, False, False),
        "names key 'k2'",
    ),
    "stale cache format": (
        lambda e: _rewrite_manifest(e, format=0),
        (False, False, False),
        "stale entry",
    ),
    "other inductor settings": (
        lambda e: _rewrite_manifest(e, settings={"cpp_cache_precompile_headers": True}),
        (False, False, False),
        "settings differ",
    ),
    "archive with a member escaping the local dir": (
        lambda e: _replace_payload(e, "inductor_dir", _escaping_tar(), fix_checksum=True),
        (True, True, False),
        "archive refused: member 'ab/../../../escaped.so': '..' component",
    ),
    "archive with a 512 MB long-name header": (
        lambda e: _replace_payload(e, "inductor_dir", header_bomb(), fix_checksum=True),
        (True, True, False),
        "archive refused: a 'L' header of 536,870,912 bytes",
    ),
    "archive that is a FIFO": (
        lambda e: _swap(e / _manifest(e)["inductor_dir"]["file"], fifo),
        (True, True, False),
        "not a regular file (a FIFO)",
    ),
    "artifacts that are /dev/zero": (
        lambda e: _swap(e / _manifest(e)["artifacts"]["file"], dev_zero),
        (True, False, True),
        "not a regular file (a character device)",
    ),
    "manifest that is a FIFO": (
        lambda e: _swap(e / MANIFEST_NAME, fifo), (False, False, False),
        "manifest unreadable: not a regular file (a FIFO)",
    ),
    "manifest 5,000 levels deep": (
        lambda e: _swap(e / MANIFEST_NAME, deep_json), (False, False, False),
        "manifest unreadable: nested deeper than",
    ),
    "manifest of 200 MB": (
        lambda e: _swap(e / MANIFEST_NAME, huge), (False, False, False),
        "manifest unreadable: larger than its limit",
    ),
    "payload name escaping the entry": (
        lambda e: _rewrite_manifest(
            e, inductor_dir={**_manifest(e)["inductor_dir"], "file": "../../etc/passwd"}
        ),
        (True, True, False),
        "bad inductor dir archive file",
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_broken_entries_are_ignored_with_a_reason(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from torch.compiler._cache import CacheInfo

    break_entry, expected, reason_part = BROKEN[name]
    real_load = torch.compiler.load_cache_artifacts
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"good:0", CacheInfo()))
    # the entry's own artifacts load; anything else goes to torch's real loader
    monkeypatch.setattr(
        torch.compiler,
        "load_cache_artifacts",
        lambda blob: CacheInfo() if blob.startswith(b"good:") else real_load(blob),
    )
    root, _ = _make_entry(tmp_path, files=FILES, name="clean")
    assert CompileCache(root, local_dir=tmp_path / "clean-reader").activate("k1").reason is None
    entry = root / "k1"
    break_entry(entry)

    local = tmp_path / "reader"
    cache = CompileCache(root, local_dir=local)
    with caplog.at_level(logging.WARNING, logger=cc.__name__):
        load_result = cache.activate("k1")
    assert (
        load_result.hit,
        load_result.artifacts_loaded,
        load_result.inductor_dir_restored,
    ) == expected
    assert load_result.reason is not None and reason_part in load_result.reason
    assert any(r.levelno == logging.WARNING for r in caplog.records), "no warning logged"
    if not expected[2]:
        assert _read_files(local) == {}  # nothing half-restored
    assert not [p for p in local.parent.iterdir() if ".restore-" in p.name]


def test_concurrent_savers_and_readers_never_see_half_an_entry(
    tmp_path: Path, fake_artifacts: list[bytes]
) -> None:
    """Two savers keep replacing the entry (different content) while a reader activates.

    Every read must restore a complete set of one saver's files and load its artifacts.
    """
    variants = {
        name: {f"{name}/{i:02d}/f": os.urandom(2000 + i) for i in range(12)} for name in "AB"
    }
    savers = {}
    for name, files in variants.items():
        savers[name] = CompileCache(tmp_path / "root", local_dir=tmp_path / f"saver{name}")
        savers[name].activate("k1")
        _write_files(tmp_path / f"saver{name}", files)
    savers["A"].save("k1")
    stop = threading.Event()
    errors: list[BaseException] = []

    def save_loop(name: str) -> None:
        try:
            while not stop.is_set():
                savers[name].save("k1")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=save_loop, args=(n,)) for n in "AB"]
    for thread in threads:
        thread.start()
    try:
        for i in range(25):
            local = tmp_path / "readers" / str(i)
            load = CompileCache(tmp_path / "root", local_dir=local).activate("k1")
            assert load.reason is None, load.reason
            assert load.hit and load.artifacts_loaded and load.inductor_dir_restored
            assert _read_files(local) in variants.values()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors


def test_unreferenced_payloads_are_removed_after_the_grace_period(
    tmp_path: Path, fake_artifacts: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, entry = _make_entry(tmp_path, files={"a": b"1"})
    first = {p.name for p in entry.iterdir()}
    _make_entry(tmp_path, files={"a": b"2"}, name="saver2")  # within grace: kept
    assert first < {p.name for p in entry.iterdir()}
    monkeypatch.setattr(cc_entry, "_ORPHAN_GRACE_S", -1.0)
    _make_entry(tmp_path, files={"a": b"3"}, name="saver3")
    manifest = _manifest(entry)
    assert {p.name for p in entry.iterdir()} == {
        MANIFEST_NAME,
        manifest["artifacts"]["file"],
        manifest["inductor_dir"]["file"],
    }


def test_reader_rereads_the_manifest_when_a_save_replaced_the_entry(
    tmp_path: Path, fake_artifacts: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = _make_entry(tmp_path, files={"a": b"old"})
    stale = CompileCache(root)._read_manifest("k1")
    monkeypatch.setattr(cc_entry, "_ORPHAN_GRACE_S", -1.0)
    _make_entry(tmp_path, files={"a": b"new"}, name="saver2")  # removes the old payloads

    real_read = CompileCache._read_manifest
    calls = []

    def read_stale_first(self: CompileCache, key: str) -> cc_entry.Manifest:
        calls.append(key)
        return stale if len(calls) == 1 else real_read(self, key)

    monkeypatch.setattr(CompileCache, "_read_manifest", read_stale_first)
    load = CompileCache(root, local_dir=tmp_path / "reader").activate("k1")
    assert load.reason is None and load.hit and load.inductor_dir_restored
    assert len(calls) == 2
    assert (tmp_path / "reader" / "a").read_bytes() == b"new"


# ---------------------------------------------------------------------------------------
# The manifest: one writer, one reader
# ---------------------------------------------------------------------------------------

SETTINGS = {"cpp_cache_precompile_headers": False}


def _any_settings(settings: dict[str, bool]) -> str | None:
    return None


def _written_manifest(entry: Path) -> cc_entry.Manifest:
    """A manifest with every part, written by `write_manifest` into `entry`."""
    entry.mkdir(parents=True)
    sha = "ab" * 32
    manifest = cc_entry.Manifest(
        key="k1", torch=torch.__version__, python="3.11", settings=dict(SETTINGS),
        created=1_795_856_001.5, host="h",
        artifacts=cc_entry.ArtifactsPart("artifacts-1.bin", 10, sha, counts={"fx": 2}),
        inductor_dir=cc_entry.ArchivePart("inductor-1.tar.gz", 20, sha, files=3,
                                          unpacked_bytes=40),
        precompiled=cc_entry.PrecompiledPart(
            "precompiled-1.bin", 30, sha,
            forwards={"a": cc_entry.Span(0, 10), "b": cc_entry.Span(10, 20)}),
        jit_forwards=("c",),
        vec_isa=cc.inductor.VecIsaRecord(ok=True, isas=("avx2",), compiler="cc: 1"))
    cc_entry.write_manifest(entry, manifest)
    return manifest


def test_the_manifest_reads_back_what_its_writer_wrote(tmp_path: Path) -> None:
    manifest = _written_manifest(tmp_path / "k1")
    assert cc_entry.read_manifest(tmp_path / "k1", "k1", _any_settings) == manifest
    doc = _manifest(tmp_path / "k1")  # the layout entries always had
    assert doc["format"] == cc_key.CACHE_FORMAT and doc["jit_forwards"] == ["c"]
    assert doc["precompiled"]["forwards"]["b"] == {"offset": 10, "size": 20}
    assert doc["inductor_dir"]["files"] == 3 and doc["artifacts"]["counts"] == {"fx": 2}


@pytest.mark.parametrize(("change", "message"), [
    ({"host": 5}, "manifest: host is 5, not a string"),
    ({"created": "now"}, "manifest: created is 'now', not a time"),
    ({"jit_forwards": "c"}, "manifest: jit_forwards is 'c', not a list of names"),
    ({"vec_isa": {"ok": 1}}, "manifest: vec_isa is {'ok': 1}, not a vector-ISA record"),
    ({"settings": {"x": 1}}, "manifest: settings is {'x': 1}, not inductor settings"),
])
def test_a_malformed_manifest_is_one_line_naming_field_and_value(
        tmp_path: Path, change: dict[str, Any], message: str) -> None:
    _written_manifest(tmp_path / "k1")
    _rewrite_manifest(tmp_path / "k1", **change)
    with pytest.raises(cc_entry.EntryError, match="^" + re.escape(message) + "$"):
        cc_entry.read_manifest(tmp_path / "k1", "k1", _any_settings)


@pytest.mark.parametrize(("part", "change", "message"), [
    ("artifacts", {"size": -1}, "manifest: the artifacts record's size is -1, not a size"),
    ("artifacts", {"sha256": "x"}, "manifest: the artifacts record's sha256 is 'x', not a "
                                   "SHA-256"),
    ("artifacts", {"counts": [1]}, "manifest: the artifacts record's counts are [1], not "
                                   "counts by kind"),
    ("inductor_dir", {"files": True}, "manifest: the inductor dir archive record's files is "
                                      "True, not a count"),
    ("inductor_dir", {"file": ".x"}, "manifest names a bad inductor dir archive file '.x'"),
    ("precompiled", {"forwards": {"a": {"offset": 0, "size": 0}}},
     "precompiled forwards index: bad span 'a': {'offset': 0, 'size': 0}"),
])
def test_a_malformed_part_is_that_part_alone_with_its_reason(
        tmp_path: Path, part: str, change: dict[str, Any], message: str) -> None:
    manifest = _written_manifest(tmp_path / "k1")
    _rewrite_manifest(tmp_path / "k1", **{part: {**_manifest(tmp_path / "k1")[part], **change}})
    read = cc_entry.read_manifest(tmp_path / "k1", "k1", _any_settings)
    assert getattr(read, part) == cc_entry.BadPart(message)
    others = {"artifacts", "inductor_dir", "precompiled"} - {part}
    assert all(getattr(read, name) == getattr(manifest, name) for name in others)
    with pytest.raises(cc_entry.EntryError, match="^" + re.escape(message) + "$"):
        cc_entry.payload(tmp_path / "k1", getattr(read, part), "the part")


# ---------------------------------------------------------------------------------------
# Real compiles, each in a fresh process
# ---------------------------------------------------------------------------------------


@pytest.mark.integration
def test_activate_waits_for_a_real_import_ahead_in_a_fresh_process(tmp_path: Path) -> None:
    """Torch's compiler imported for real on the thread, in a process that has not
    imported it: `activate` waits for what is left of it, which is no more than it took.
    (An entry there but stale, and the vector ISA settled by the user: no probe, whose
    modules and inductor's compile entry point a miss imports besides.)"""
    (tmp_path / "root" / "k").mkdir(parents=True)
    (tmp_path / "root" / "k" / MANIFEST_NAME).write_text('{"format": 0}')
    code = (
        "import json, sys\n"
        "import torch\n"
        "from airflow_ett.trainer.compile_cache import (COMPILER_MODULES, CompileCache,\n"
        "    compiler_import_ahead, start_compiler_import)\n"
        "assert 'torch._inductor.codecache' not in sys.modules\n"
        "start_compiler_import()\n"
        f"cache = CompileCache({str(tmp_path / 'root')!r}, local_dir={str(tmp_path / 'l')!r})\n"
        "load = cache.activate('k')\n"
        "began, ended = compiler_import_ahead()\n"
        "print(json.dumps({'took': ended - began, 'waited': load.breakdown['import_compiler'],\n"
        "                  'all': all(m in sys.modules for m in COMPILER_MODULES)}))\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_VEC_ISA_OK": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state["all"] is True
    assert 0 < state["waited"] <= state["took"] + 0.05, state


_ISA_PROBE_CODE = """\
import dataclasses, importlib, json, sys
import torch
from airflow_ett.trainer.compile_cache import inductor
for name in (*inductor.PROBE_MODULES, "torch._inductor.compile_fx"):
    importlib.import_module(name)
before = set(sys.modules)
settle = inductor.VecIsaSettle.begin(None, on_thread=sys.argv[1] == "thread")
record = settle.wait()
print(json.dumps({"record": record and dataclasses.asdict(record), "thread": settle.on_thread,
                  "imported": sorted(set(sys.modules) - before)}))
"""


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA probe")
def test_the_real_vector_isa_probe_on_a_thread_imports_nothing_and_answers_the_same(
    tmp_path: Path,
) -> None:
    """Torch's probe for real, each way in a fresh process with a fresh inductor dir (so
    it builds): on its thread it imports nothing `PROBE_MODULES` did not (no import can
    meet the compiler's import in a cycle of module locks), and it answers as the
    synchronous probe does."""
    answers = {}
    for how in ("thread", "here"):
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_VEC_ISA_OK"}
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / how)
        done = subprocess.run([sys.executable, "-c", _ISA_PROBE_CODE, how], capture_output=True,
                              text=True, env=env, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        answers[how] = json.loads(done.stdout.strip().splitlines()[-1])
    assert answers["thread"]["thread"] is True and answers["here"]["thread"] is False
    assert answers["thread"]["imported"] == []
    assert answers["thread"]["record"] == answers["here"]["record"]
    assert answers["thread"]["record"]["ok"] is True


PROBE = "airflow_ett.trainer.compile_probe"


def _probe(root: Path, local: Path, *args: str, tmpdir: Path | None = None
           ) -> tuple[dict[str, Any], str]:
    """The probe in a fresh process; with `tmpdir`, on a fresh host (its own TMPDIR, where
    inductor keeps host-wide files such as precompiled headers)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_VEC_ISA_OK",
                     "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS")
    }
    if tmpdir is not None:
        tmpdir.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(tmpdir)
    proc = subprocess.run(
        [sys.executable, "-m", PROBE, "--root", str(root), "--local-dir", str(local), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("COMPILE_PROBE ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("COMPILE_PROBE "))
    return result, proc.stderr


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One cold compile that saves its entry; shared by every test below."""
    base = tmp_path_factory.mktemp("compile-cache")
    result, _ = _probe(base / "root", base / "cold-local", "--save")
    result["root"] = base / "root"
    result["base"] = base
    return result


@pytest.mark.integration
@pytest.mark.slow
def test_cold_process_misses_compiles_ahead_of_time_and_saves(cold: dict[str, Any]) -> None:
    assert cold["load"]["hit"] is False and "no entry" in cold["load"]["reason"]
    counters = cold["counters"]
    assert counters["graphs"] == 1 and counters["recompiles"] == 0
    assert counters["precompiled_compiled"] == 1 and counters["precompiled_fallbacks"] == 0
    assert counters["aot_autograd_cache_misses"] > 0 and counters["fx_graph_cache_hits"] == 0
    assert Path(cold["entry"]) == cold["root"] / cold["key"]
    assert CompileCache(cold["root"]).has(cold["key"])
    assert list(_manifest(Path(cold["entry"]))["precompiled"]["forwards"]) == ["mlp"]
    assert _manifest(Path(cold["entry"]))["jit_forwards"] == []
    # compiled as torch compiles by default (headers precompiled), its kernels keyed
    # without the switch
    assert _manifest(Path(cold["entry"]))["settings"] == {HEADERS: True, FREE: True}
    assert cold["needs_save"] is True


@pytest.mark.integration
@pytest.mark.slow
def test_warm_process_restores_the_entry_and_compiles_faster(
    cold: dict[str, Any], tmp_path: Path
) -> None:
    """The precompiled forward is loaded with its guards and trains (forward and backward)
    with no dynamo trace at all; the artifacts are not needed, so not loaded. On a fresh
    host, with C++ headers not precompiled (the cold process had them on): no header is
    built and no kernel either, every one is found in the restored archive."""
    import tarfile

    local = tmp_path / "warm-local"
    warm, _ = _probe(cold["root"], local, tmpdir=tmp_path / "tmp")
    load = warm["load"]
    assert (load["hit"], load["artifacts_loaded"], load["inductor_dir_restored"]) == (
        True,
        False,
        True,
    ), load["reason"]
    assert load["reason"] is None and load["artifacts_deferred"] is True
    assert load["precompiled"] == ["mlp"]
    assert warm["key"] == cold["key"]
    counters = warm["counters"]
    assert counters["precompiled_loaded"] == 1 and counters["precompiled_fallbacks"] == 0
    assert counters["graphs"] == 0 and counters["recompiles"] == 0  # dynamo never traced
    assert warm["needs_save"] is False
    assert warm["breakdown"]["dynamo_trace"] == 0.0
    assert warm["compile_s"] < cold["compile_s"], (warm["compile_s"], cold["compile_s"])
    assert warm["losses"] == pytest.approx(cold["losses"], rel=1e-6)
    manifest = _manifest(Path(cold["entry"]))
    with tarfile.open(Path(cold["entry"]) / manifest["inductor_dir"]["file"]) as tar:
        archived = {member.name for member in tar.getmembers()}
    assert any(name.endswith(".so") for name in archived)
    built = [str(p.relative_to(local)) for p in local.rglob("*.so")
             if str(p.relative_to(local)) not in archived]
    assert built == []  # no gcc ran
    assert not list((tmp_path / "tmp").glob("torchinductor_*/precompiled_headers/*"))


@pytest.mark.integration
@pytest.mark.slow
def test_a_precompiled_forward_whose_guards_reject_the_call_compiles_just_in_time(
    cold: dict[str, Any], tmp_path: Path
) -> None:
    """An entry filed under another key (batch 16 here, compiled for 32): the loaded
    guards reject the call, the forward compiles just in time and training is right."""
    from airflow_ett.trainer import compile_probe

    key = cache_key(compile_probe.model_config("mlp", 16, {}), device_kind("cpu"))
    root = tmp_path / "root"
    shutil.copytree(cold["root"] / cold["key"], root / key)
    _rewrite_manifest(root / key, key=key)
    result, stderr = _probe(root, tmp_path / "local", "--batch", "16", "--steps", "2")
    counters = result["counters"]
    assert counters["precompiled_loaded"] == 1 and counters["precompiled_fallbacks"] == 2
    assert "precompiled forward mlp rejects this call" in stderr
    model, _, batch = compile_probe.build("mlp", 16)  # the same steps, eagerly
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    eager = []
    for _ in range(2):
        loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        eager.append(float(loss.detach()))
    assert result["losses"] == pytest.approx(eager, rel=1e-5)


@pytest.mark.integration
@pytest.mark.slow
def test_changed_config_is_a_miss(cold: dict[str, Any], tmp_path: Path) -> None:
    other, _ = _probe(
        cold["root"], tmp_path / "other-local", "--config-extra", '{"hidden": 128}', "--no-compile"
    )
    assert other["key"] != cold["key"]
    assert other["load"]["hit"] is False
    assert "no entry for key" in other["load"]["reason"]


@pytest.mark.integration
@pytest.mark.slow
def test_entry_with_garbage_artifacts_is_used_partly_and_compile_works(
    cold: dict[str, Any], tmp_path: Path
) -> None:
    """Artifacts torch cannot read (checksum valid, so torch's own loader is what rejects
    them, as for artifacts of another torch build): the archive still helps."""
    root = tmp_path / "root"
    shutil.copytree(cold["root"], root)
    _replace_payload(root / cold["key"], "artifacts", b"\x00garbage" * 64, fix_checksum=True)
    # a just-in-time compile (not deferred: the artifacts are loaded in activate), with
    # the headers as the precompiled path has them (the entry was saved that way)
    result, stderr = _probe(root, tmp_path / "local", "--compile", "jit", "--headers", "auto")
    load = result["load"]
    assert (load["hit"], load["artifacts_loaded"], load["inductor_dir_restored"]) == (
        True,
        False,
        True,
    )
    assert "artifacts not loaded" in load["reason"]
    assert "WARNING compile cache entry" in stderr
    assert result["counters"]["graphs"] == 1
    assert result["losses"] == pytest.approx(cold["losses"], rel=1e-6)


@pytest.mark.integration
@pytest.mark.slow
def test_corrupt_entry_is_ignored_and_compile_works(cold: dict[str, Any], tmp_path: Path) -> None:
    """Truncated archive and garbage artifacts: a plain miss, then a normal cold compile."""
    root = tmp_path / "root"
    shutil.copytree(cold["root"], root)
    entry = root / cold["key"]
    _truncate_archive(entry)
    _replace_payload(entry, "artifacts", b"garbage", fix_checksum=False)
    _replace_payload(entry, "precompiled", b"garbage", fix_checksum=False)
    result, stderr = _probe(root, tmp_path / "local", "--steps", "2", "--compile", "jit",
                            "--headers", "auto")
    load = result["load"]
    assert (load["hit"], load["artifacts_loaded"], load["inductor_dir_restored"]) == (
        False,
        False,
        False,
    )
    assert "inductor dir not restored" in load["reason"]
    assert "artifacts not loaded" in load["reason"]
    assert "precompiled forwards not read" in load["reason"]
    assert "WARNING compile cache entry" in stderr
    assert result["counters"]["fx_graph_cache_misses"] > 0
    assert result["losses"] == pytest.approx(cold["losses"][:2], rel=1e-6)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 ISA probe")
def test_a_hit_answers_the_vector_isa_probe_without_running_it(
    cold: dict[str, Any], tmp_path: Path
) -> None:
    manifest = json.loads((Path(cold["entry"]) / "manifest.json").read_text())
    recorded = manifest["vec_isa"]
    assert recorded["ok"] is True and recorded["isas"] and recorded["compiler"]
    code = (
        "import json, sys\n"
        "from airflow_ett.trainer.compile_cache import CompileCache\n"
        "import torch._inductor.config as c\n"
        "from torch._inductor import cpu_vec_isa as v\n"
        f"load = CompileCache({str(cold['root'])!r}, local_dir={str(tmp_path / 'l')!r})"
        f".activate({cold['key']!r})\n"
        "print(json.dumps({'hit': load.hit, 'ok': c.cpp.vec_isa_ok,\n"
        "                  'probed': v.valid_vec_isa_list.cache_info().currsize}))\n"
    )
    env = {k: val for k, val in os.environ.items() if k != "TORCHINDUCTOR_VEC_ISA_OK"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads(done.stdout.strip().splitlines()[-1])
    assert state == {"hit": True, "ok": True, "probed": 0}  # trusted, no probe ran
