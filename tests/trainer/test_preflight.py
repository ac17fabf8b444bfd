"""Preflight: what cannot run is refused before any allocation, in one line (exit 78).

Unit tests on the checks, then the real CLI (`python -m airflow_ett.trainer`) for the
cases of issue 8.7: each exits 78 with one `trainer: error:` line naming the field.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_ett.protocol.exits import EXIT_BAD_CONFIG
from airflow_ett.trainer.config import ConfigError, config_from_mapping
from airflow_ett.trainer.model_config import BUNDLED
from airflow_ett.trainer.preflight import (
    MEMORY_LIMIT_ENV,
    PARSE_TIME_MEMORY_CAP_BYTES,
    WORKER_PROCESS_BYTES,
    check_memory,
    estimate_memory,
    preflight,
    shapes_of,
)
from airflow_ett.trainer.readers import Reader
from tests.hostile import HOSTILE_JSON

TINY = BUNDLED["dlrm_tiny"]
R = Reader("trainer config", ConfigError)
HUGE_MODEL = TINY.to_dict() | {"tables": [["cat_0", 10**12], ["cat_1", 1000]]}


def cfg(tmp_path: Path, **fields: Any) -> Any:
    base: dict[str, Any] = {"model": "dlrm_tiny", "steps": 3, "batch_size": 64,
                            "checkpoint_dir": str(tmp_path / "ckpt"), "compile": False}
    return config_from_mapping(base | fields)


def test_estimate_counts_weights_gradients_and_adagrad_in_one_process() -> None:
    one = estimate_memory(TINY, 64, prefetch=4, num_workers=1)
    rows = sum(r for _, r in TINY.tables)
    assert one.tables == 3 * rows * TINY.embedding_dim * 4
    assert one.batches_in_flight == 6
    # dense + label floats, int64 ids and int32 lengths per feature
    assert one.bytes_per_example == 8 * 4 + 4 + 3 * 2 * 8 + 3 * 4
    sharded = estimate_memory(TINY, 64, world_size=4)
    assert sharded.tables == -(-(rows * 8 * 4 + rows * 4) // 4)


def test_memory_check_names_the_field_that_takes_the_most() -> None:
    huge = shapes_of(config_from_mapping({"model": HUGE_MODEL, "steps": 1,
                                          "checkpoint_dir": "c"}))
    with pytest.raises(ConfigError) as info:
        check_memory(huge, 64, prefetch=4, num_workers=1, world_size=1,
                     host_available=10**10, device_available=None, processes_per_host=1,
                     reader=R, where_available="available")
    assert str(info.value).startswith("trainer config: model.tables[cat_0] = 1000000000000:")
    assert "96.0 TB" in str(info.value) and "10.0 GB available" in str(info.value)
    with pytest.raises(ConfigError, match=r"^trainer config: batch_size = 1000000000: "):
        check_memory(TINY, 10**9, prefetch=4, num_workers=1, world_size=1,
                     host_available=10**10, device_available=None, processes_per_host=1,
                     reader=R, where_available="available")
    # on a GPU the model is checked against the device, the batches against the host
    with pytest.raises(ConfigError, match=r"model.tables\[cat_0\].*\(device memory\)"):
        check_memory(huge, 64, prefetch=4, num_workers=1, world_size=1,
                     host_available=10**12, device_available=10**9, processes_per_host=1,
                     reader=R, where_available="available")
    check_memory(TINY, 64, prefetch=4, num_workers=1, world_size=1, host_available=10**9,
                 device_available=None, processes_per_host=1, reader=R,
                 where_available="available")
    assert PARSE_TIME_MEMORY_CAP_BYTES == 2**40


@pytest.mark.parametrize(("prefetch", "workers", "in_flight"), [
    (4, 0, 1),  # built inline: the step's batch only
    (4, 1, 6),  # a queue of 4, one being built, the step's
    (4, 2, 7),  # two queues of 2, two being built, the step's
    (4, 8, 17),  # eight queues of 1 (never 0), eight being built, the step's
    (1, 100_000, 200_001),
])
def test_batches_in_flight_are_counted_as_the_worker_pool_holds_them(
        prefetch: int, workers: int, in_flight: int) -> None:
    est = estimate_memory(TINY, 64, prefetch=prefetch, num_workers=workers)
    assert est.batches_in_flight == in_flight
    assert est.workers == workers * WORKER_PROCESS_BYTES
    assert est.total == est.model + est.batches + est.activations + est.workers


def test_every_data_worker_process_is_counted_against_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """100,000 workers would be 100,000 processes: at 16 MiB each, 1.7 TB, past the
    parse-time cap, and past a 10 GB host by far; the error names num_workers."""
    with pytest.raises(ConfigError) as info:
        check_memory(TINY, 64, prefetch=4, num_workers=100_000, world_size=1,
                     host_available=PARSE_TIME_MEMORY_CAP_BYTES, device_available=None,
                     processes_per_host=1, reader=R, where_available="available")
    assert str(info.value).startswith(
        "trainer config: num_workers = 100000: 100000 data worker processes need an "
        "estimated 1.7 TB (at least 16.8 MB each, plus 200001 batches in flight")
    with pytest.raises(ConfigError, match=r"^trainer config: num_workers = 64: .*\(host "
                                          r"memory\); use fewer workers$"):
        check_memory(TINY, 64, prefetch=4, num_workers=64, world_size=1,
                     host_available=10**9, device_available=10**10, processes_per_host=1,
                     reader=R, where_available="available")
    check_memory(TINY, 64, prefetch=4, num_workers=32, world_size=1, host_available=10**9,
                 device_available=10**10, processes_per_host=1, reader=R,
                 where_available="available")


def test_a_data_cursor_past_64_bits_is_refused(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    big = cfg(tmp_path, steps=10**9, batch_size=2**20)
    preflight(big, cuda_free=lambda: None)  # 2**50 examples on one process: fits
    monkeypatch.setenv("WORLD_SIZE", "10000")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ConfigError) as info:
        preflight(big, cuda_free=lambda: None)
    assert str(info.value) == (
        "trainer config: steps = 1000000000: x batch_size 1048576 x 10000 process(es) is a "
        "data cursor past 9223372036854775807 (64-bit), which no event can record")
    monkeypatch.setenv("WORLD_SIZE", str(2**20 + 1))
    with pytest.raises(ConfigError, match=r"WORLD_SIZE = '1048577': must be an integer >= 1 "
                                          r"and <= 1048576"):
        preflight(cfg(tmp_path), cuda_free=lambda: None)


def test_two_processes_on_one_host_share_its_memory(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    need = estimate_memory(TINY, 64, world_size=2).total  # per process, sharded
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(need + need // 2))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # one process per host: fits
    preflight(cfg(tmp_path), cuda_free=lambda: None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="x 2 processes on this host"):
        preflight(cfg(tmp_path), cuda_free=lambda: None)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, "lots")
    with pytest.raises(ConfigError, match="ETT_MEMORY_LIMIT_BYTES = 'lots'"):
        preflight(cfg(tmp_path), cuda_free=lambda: None)


def test_paths_that_cannot_be_written_are_named(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match=r"checkpoint_dir = '.*a_file': exists and is not a "
                                          "directory"):
        preflight(cfg(tmp_path, checkpoint_dir=str(a_file)), cuda_free=lambda: None)
    with pytest.raises(ConfigError, match=r"checkpoint_dir = '.*a_file/ckpt': cannot create"):
        preflight(cfg(tmp_path, checkpoint_dir=str(a_file / "ckpt")), cuda_free=lambda: None)
    with pytest.raises(ConfigError, match=r"compile_cache_dir = '.*a_file/cache': cannot"):
        preflight(cfg(tmp_path, compile=True, compile_cache_dir=str(a_file / "cache")),
                  prewarm=True, cuda_free=lambda: None)
    with pytest.raises(ConfigError, match=r"events_file = '.*': is a directory"):
        preflight(cfg(tmp_path, events_file=str(tmp_path)), cuda_free=lambda: None)
    with pytest.raises(ConfigError, match="--prewarm: needs compile = true"):
        preflight(cfg(tmp_path), prewarm=True, cuda_free=lambda: None)
    preflight(cfg(tmp_path), cuda_free=lambda: None)
    assert (tmp_path / "ckpt").is_dir() and not list((tmp_path / "ckpt").iterdir())


@contextlib.contextmanager
def unprivileged() -> Iterator[None]:
    """Root writes through any mode bits (CI runs as root): check as `nobody` then, by
    the effective uid, which is what the kernel's permission checks use."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_an_unwritable_directory_is_named() -> None:
    # Not under tmp_path: pytest's base dir is private to its owner, so `nobody` could
    # not even reach the directory under test.
    base = Path(tempfile.mkdtemp(prefix="ett-preflight-"))
    try:
        base.chmod(0o755)
        ro = base / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        # once as ourselves first: what it imports lazily (codecs) is then loaded, since
        # `nobody` cannot read a Python installed under /root
        preflight(cfg(base, checkpoint_dir=str(base / "ok")), cuda_free=lambda: None)
        with unprivileged(), pytest.raises(
                ConfigError, match=r"checkpoint_dir = '.*ro': not writable"):
            preflight(cfg(base, checkpoint_dir=str(ro)), cuda_free=lambda: None)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- through the real CLI ---------------------------------------------------------------

TIMEOUT = 240


def run_cli(tmp_path: Path, *extra: str, **fields: Any) -> subprocess.CompletedProcess[str]:
    base: dict[str, Any] = {"model": "dlrm_tiny", "steps": 6, "batch_size": 32,
                            "checkpoint_dir": "ckpt", "checkpoint_interval": 3,
                            "num_workers": 0, "compile": False, "events_file": "events.jsonl",
                            "log_every_s": 1.0}
    config = tmp_path / "job.json"
    config.write_text(json.dumps(base | fields))  # json writes NaN for float("nan")
    return subprocess.run(
        [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config),
         "--job-id", "pf", "--attempt-number", "1", *extra],
        capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=tmp_path,
        env={**os.environ, "AIRFLOW__ETT__DISABLED": "True"},
    )


def refused(done: subprocess.CompletedProcess[str], *named: str) -> str:
    assert done.returncode == EXIT_BAD_CONFIG, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("trainer: error:")]
    assert len(errors) == 1, done.stderr
    for name in named:
        assert name in errors[0], errors[0]
    return errors[0]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cli_refuses_what_cannot_run_with_exit_78(tmp_path: Path) -> None:
    refused(run_cli(tmp_path, model=HUGE_MODEL), "model.tables[cat_0] = 1000000000000",
            "TB")
    refused(run_cli(tmp_path, batch_size=10**9), "batch_size = 1000000000")
    refused(run_cli(tmp_path, lr_dense=float("nan")), "lr_dense = nan")
    (tmp_path / "a_file").write_text("x")
    refused(run_cli(tmp_path, checkpoint_dir="a_file"), "checkpoint_dir", "a_file",
            "not a directory")
    refused(run_cli(tmp_path, "--prewarm", compile=True, compile_cache_dir="a_file/cache"),
            "compile_cache_dir", "a_file/cache")
    refused(run_cli(tmp_path, "--attempt-number", "x"), "--attempt-number")
    # issue 22: numbers out of their plausible range, each named before any work
    refused(run_cli(tmp_path, step_sleep_s=1e308), "step_sleep_s = 1e+308")
    refused(run_cli(tmp_path, data_startup_latency_s=1e308), "data_startup_latency_s = 1e+308")
    refused(run_cli(tmp_path, num_workers=100_000), "num_workers = 100000")
    refused(run_cli(tmp_path, faults=[{"kind": "raise", "at_step": 7}]),
            "faults[0].at_step = 7", "steps (6)")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cli_refuses_a_hostile_config_file_with_exit_78(tmp_path: Path) -> None:
    """Non-UTF-8 or deeply nested configs exited 1 with a traceback (retried); a FIFO or
    /dev/zero hung the trainer. Each is one line and exit 78, before any work."""
    for kind, make in HOSTILE_JSON:
        config = tmp_path / f"{kind}.json"
        says = make(config)
        done = subprocess.run(
            [sys.executable, "-m", "airflow_ett.trainer", "--config", str(config),
             "--job-id", "pf", "--attempt-number", "1"],
            capture_output=True, text=True, timeout=TIMEOUT, check=False, cwd=tmp_path,
            env={**os.environ, "AIRFLOW__ETT__DISABLED": "True"})
        refused(done, f"trainer config {config}: {says}")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cli_refuses_a_directory_holding_another_models_checkpoints(tmp_path: Path) -> None:
    done = run_cli(tmp_path)  # dlrm_tiny trains and checkpoints
    assert done.returncode == 0, done.stderr[-3000:]
    markers = sorted((tmp_path / "ckpt").glob("step-*/COMMITTED.json"))
    assert markers
    extra = json.loads(markers[-1].read_text())["extra"]
    assert extra["model_identity"] == config_from_mapping(
        {"model": "dlrm_tiny", "steps": 1, "checkpoint_dir": "c"}).model_identity
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    line = refused(run_cli(tmp_path, model="dlrm_small"), "checkpoint_dir",
                   "another model", "'dlrm_tiny'", "'dlrm_small'")
    assert extra["model_identity"] in line
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == before  # nothing lost
    assert run_cli(tmp_path, steps=9).returncode == 0  # the same model resumes
