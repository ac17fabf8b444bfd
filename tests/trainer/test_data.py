"""The synthetic click log: determinism, resumption, ranks, the fast batch, shutdown, errors.

Spawned workers cost process starts, so the worker tests are few and each starts its
pipelines together (their starts overlap) and checks several things on them.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedTensor

from airflow_ett.trainer.data import (
    FAST_BATCH_CURSOR,
    Batch,
    ClickLogSpec,
    DataPipeline,
    fast_batch,
    make_batch,
)
from airflow_ett.trainer.data_gen import generate_samples

SPEC = ClickLogSpec(
    seed=11, num_dense=5, tables=(("user", 1000), ("item", 50), ("ctx", 7)),
    ids_per_feature=3, batch_size=16,
)


def spec_with(**changes: object) -> ClickLogSpec:
    fields = {
        "seed": SPEC.seed, "num_dense": SPEC.num_dense, "tables": SPEC.tables,
        "ids_per_feature": SPEC.ids_per_feature, "batch_size": SPEC.batch_size,
    }
    fields.update(changes)
    return ClickLogSpec(**fields)  # type: ignore[arg-type]


def assert_same(a: Batch, b: Batch) -> None:
    """Bitwise equality of two batches, cursors included."""
    assert (a.cursor_start, a.cursor_end) == (b.cursor_start, b.cursor_end)
    assert torch.equal(a.dense, b.dense)
    assert torch.equal(a.labels, b.labels)
    assert a.sparse.keys() == b.sparse.keys()
    assert torch.equal(a.sparse.values(), b.sparse.values())
    assert torch.equal(a.sparse.lengths(), b.sparse.lengths())


def gone(pid: int) -> bool:
    """The process no longer runs (reaped, or a zombie waiting for a reaper)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return all(gone(p) for p in pids)


# ----------------------------------------------------------------------------- spec


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"batch_size": 0}, "batch_size", "0"),
        ({"batch_size": -3}, "batch_size", "-3"),
        ({"tables": ()}, "tables", "()"),
        ({"tables": (("a", 10), ("b", 0))}, "num_embeddings", "0"),
        ({"tables": (("a", -1),)}, "num_embeddings", "-1"),
        ({"tables": (("a", 10), ("a", 20))}, "tables", "unique"),
        ({"tables": (("", 10),)}, "name", "''"),
        ({"tables": (("a",),)}, "tables[0]", "('a',)"),
        ({"ids_per_feature": 0}, "ids_per_feature", "0"),
        ({"num_dense": -1}, "num_dense", "-1"),
        ({"seed": -1}, "seed", "-1"),
        ({"batch_size": 2.5}, "batch_size", "2.5"),
        ({"batch_size": True}, "batch_size", "True"),
    ],
)
def test_bad_spec_values_name_the_field_and_value(
    changes: dict[str, object], field: str, value: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(field)) as info:
        spec_with(**changes)
    assert value in str(info.value)


def test_spec_normalises_lists_from_config_files() -> None:
    spec = spec_with(tables=[["user", 1000], ["item", 50], ["ctx", 7]])
    assert spec == SPEC and hash(spec) == hash(SPEC)
    assert spec.feature_names == ["user", "item", "ctx"]


@pytest.mark.parametrize("cursor", [-1, -256, 1.5, "0"])
def test_bad_cursor_is_rejected(cursor: object) -> None:
    with pytest.raises(ValueError, match="cursor"):
        make_batch(SPEC, cursor)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="start_cursor"):
        DataPipeline(SPEC, start_cursor=cursor, num_workers=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_workers": -1}, "num_workers"),
        ({"prefetch": 0}, "prefetch"),
        ({"world_size": 0}, "world_size"),
        ({"rank": 2, "world_size": 2}, "rank"),
        ({"rank": -1}, "rank"),
        ({"startup_latency_s": -1.0}, "startup_latency_s"),
        ({"inject_failure_at": -5}, "inject_failure_at"),
    ],
)
def test_bad_pipeline_arguments(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        DataPipeline(SPEC, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- batches


def test_batch_shapes_dtypes_and_layout() -> None:
    b = make_batch(SPEC, 32)
    n, f, ell = SPEC.batch_size, SPEC.num_features, SPEC.ids_per_feature
    assert (b.cursor_start, b.cursor_end) == (32, 32 + n) and not b.is_fast
    assert b.dense.shape == (n, SPEC.num_dense) and b.dense.dtype == torch.float32
    assert b.labels.shape == (n,) and b.labels.dtype == torch.float32
    assert set(b.labels.tolist()) <= {0.0, 1.0}
    assert b.sparse.keys() == ["user", "item", "ctx"]
    assert b.sparse.values().dtype == torch.int64 and b.sparse.values().numel() == f * n * ell
    assert torch.all(b.sparse.lengths() == ell) and b.sparse.stride() == n
    for name, rows in SPEC.tables:
        ids = b.sparse[name].values()
        assert ids.numel() == n * ell and int(ids.min()) >= 0 and int(ids.max()) < rows


def test_fast_batch_has_the_real_shapes_and_is_never_data() -> None:
    real, fast = make_batch(SPEC, 0), fast_batch(SPEC)
    assert fast.is_fast and fast.cursor_start == fast.cursor_end == FAST_BATCH_CURSOR
    for a, b in [
        (real.dense, fast.dense),
        (real.labels, fast.labels),
        (real.sparse.values(), fast.sparse.values()),
        (real.sparse.lengths(), fast.sparse.lengths()),
        (real.sparse.offsets(), fast.sparse.offsets()),
    ]:
        assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(real.sparse.lengths(), fast.sparse.lengths())
    assert real.sparse.keys() == fast.sparse.keys()
    assert real.sparse.stride() == fast.sparse.stride()


def test_batches_feed_an_embedding_bag_collection() -> None:
    dims = {"user": 4, "item": 3, "ctx": 2}
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_{name}", embedding_dim=dims[name], num_embeddings=rows,
                feature_names=[name],
            )
            for name, rows in SPEC.tables
        ]
    )
    for batch in (make_batch(SPEC, 0).to("cpu"), fast_batch(SPEC)):
        out = ebc(batch.sparse)
        assert isinstance(out, KeyedTensor)
        assert out.keys() == ["user", "item", "ctx"]
        assert out.values().shape == (SPEC.batch_size, sum(dims.values()))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**64 - 1),
    first=st.integers(0, 2**40),
    offset=st.integers(0, 20),
    count=st.integers(1, 12),
)
def test_a_sample_depends_only_on_seed_and_index(
    seed: int, first: int, offset: int, count: int
) -> None:
    spec = spec_with(seed=seed)
    wide = generate_samples(spec, first, offset + count)
    narrow = generate_samples(spec, first + offset, count)
    np.testing.assert_array_equal(wide[0][offset:], narrow[0])
    np.testing.assert_array_equal(wide[1][:, offset:], narrow[1])
    np.testing.assert_array_equal(wide[2][offset:], narrow[2])


def test_batch_size_does_not_change_the_samples_but_the_seed_does() -> None:
    small = make_batch(spec_with(batch_size=4), 20)
    big = make_batch(spec_with(batch_size=40), 0)
    assert torch.equal(small.dense, big.dense[20:24])
    assert torch.equal(small.labels, big.labels[20:24])
    assert torch.equal(small.sparse["item"].values(), big.sparse["item"].values()[60:72])
    other = make_batch(spec_with(seed=12), 0)
    assert not torch.equal(other.dense, make_batch(SPEC, 0).dense)


def test_ranks_split_the_global_batch_and_report_the_global_cursor() -> None:
    whole = make_batch(spec_with(batch_size=2 * SPEC.batch_size), 48)
    n = SPEC.batch_size
    for rank in (0, 1):
        part = make_batch(SPEC, 48, rank=rank, world_size=2)
        assert (part.cursor_start, part.cursor_end) == (48, 48 + 2 * n)
        assert torch.equal(part.dense, whole.dense[rank * n : (rank + 1) * n])
        assert torch.equal(part.labels, whole.labels[rank * n : (rank + 1) * n])
        for name in SPEC.feature_names:
            assert torch.equal(
                part.sparse[name].values(),
                whole.sparse[name].values()[rank * n * 3 : (rank + 1) * n * 3],
            )


def test_labels_are_learnable() -> None:
    """A small model's loss really falls: labels follow the features, not only noise."""
    torch.manual_seed(0)
    spec = spec_with(batch_size=256, tables=(("a", 100), ("b", 1000)), ids_per_feature=2)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=f"t_{n}", embedding_dim=8, num_embeddings=r, feature_names=[n])
            for n, r in spec.tables
        ]
    )
    head = torch.nn.Linear(spec.num_dense + 16, 1)
    opt = torch.optim.Adam([*ebc.parameters(), *head.parameters()], lr=0.05)
    losses = []
    for step in range(60):
        b = make_batch(spec, step * spec.batch_size)
        logits = head(torch.cat([b.dense, ebc(b.sparse).values()], dim=1)).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    first, last = sum(losses[:5]) / 5, sum(losses[-15:]) / 15
    assert first > 0.6 and last < min(0.55, first - 0.1), (first, last)


# ----------------------------------------------------------------------------- inline


def test_inline_pipeline_resumes_exactly_and_reports_the_cursor() -> None:
    n = SPEC.batch_size
    with DataPipeline(SPEC, num_workers=0) as ref:
        ref.wait_ready()
        assert ref.cursor() == 0 and ref.first_batch_s is not None
        it = iter(ref)
        reference = [next(it) for _ in range(6)]
        assert ref.cursor() == 6 * n
    assert [b.cursor_start for b in reference] == [k * n for k in range(6)]
    for k, b in enumerate(reference):
        assert_same(b, make_batch(SPEC, k * n))
    with DataPipeline(SPEC, start_cursor=3 * n, num_workers=0) as resumed:
        assert resumed.cursor() == 3 * n
        for want, got in zip(reference[3:], resumed, strict=False):
            assert_same(want, got)
        assert resumed.cursor() == 6 * n
    with pytest.raises(RuntimeError, match="closed"):
        resumed.next_batch()
    resumed.close()  # idempotent


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pipeline_connected_before_its_cursor_is_known_starts_where_told(
        num_workers: int) -> None:
    """A warm spare's pipeline: started (its workers' start-up paid) with no cursor, then
    told where the restore says; its batches are those of a pipeline started there."""
    n = SPEC.batch_size
    with DataPipeline(SPEC, start_cursor=None, num_workers=num_workers,
                      startup_latency_s=0.2) as early:
        early.start()
        with pytest.raises(RuntimeError, match="no start cursor yet"):
            early.next_batch(timeout=5.0)
        time.sleep(0.3)  # connected meanwhile
        early.set_start_cursor(5 * n)
        with pytest.raises(RuntimeError, match=r"already set \(320\)|already set"):
            early.set_start_cursor(0)
        assert early.cursor() == 5 * n and early.start_cursor == 5 * n
        got = [early.next_batch(timeout=30.0) for _ in range(4)]
    for k, batch in enumerate(got):
        assert_same(batch, make_batch(SPEC, (5 + k) * n))
    with pytest.raises(ValueError, match="start_cursor"):
        DataPipeline(SPEC, start_cursor=None, num_workers=0).set_start_cursor(-1)


def test_inline_pipeline_ranks_share_a_global_cursor() -> None:
    n = SPEC.batch_size
    for rank in (0, 1):
        p = DataPipeline(SPEC, start_cursor=4 * n, num_workers=0, rank=rank, world_size=2)
        batches = [p.next_batch() for _ in range(3)]
        assert [b.cursor_start for b in batches] == [4 * n, 6 * n, 8 * n]
        assert p.cursor() == 10 * n
        for b in batches:
            assert_same(b, make_batch(SPEC, b.cursor_start, rank=rank, world_size=2))
        p.close()


def test_inline_failure_names_the_cursor() -> None:
    p = DataPipeline(SPEC, num_workers=0, inject_failure_at=2 * SPEC.batch_size + 1)
    p.next_batch()
    p.next_batch()
    with pytest.raises(RuntimeError, match=f"cursor {2 * SPEC.batch_size}"):
        p.next_batch()
    p.close()


# ----------------------------------------------------------------------------- workers


@pytest.mark.timeout(60)
def test_workers_resume_exactly_in_order_and_leave_no_process() -> None:
    """num_workers 1 and 2, ranks of 2, early stop, GC and `with` exits: all exact, all reaped."""
    n = SPEC.batch_size
    reference = [make_batch(SPEC, k * n) for k in range(9)]
    two = DataPipeline(SPEC, num_workers=2, prefetch=2)  # from 0
    one = DataPipeline(SPEC, start_cursor=5 * n, num_workers=1)  # resumed
    rank1 = DataPipeline(SPEC, start_cursor=4 * n, num_workers=2, rank=1, world_size=2)
    pipelines = [two, one, rank1]
    started = time.monotonic()
    for p in pipelines:
        p.start()
    assert time.monotonic() - started < 2.0, "start() must not wait for the workers"

    # wait_ready from another thread (parallel init), then iterate on this one.
    ready = threading.Thread(target=two.wait_ready, kwargs={"timeout": 30})
    ready.start()
    ready.join()
    assert two.first_batch_s is not None and two.cursor() == 0
    got = [two.next_batch() for _ in range(9)]
    for want, b in zip(reference, got, strict=True):
        assert_same(want, b)
    assert two.cursor() == 9 * n

    for k, b in zip(range(5, 9), one, strict=False):  # stops early: the generator is dropped
        assert_same(reference[k], b)
    assert one.cursor() == 9 * n

    for k in range(3):
        c = (4 + 2 * k) * n
        assert_same(rank1.next_batch(), make_batch(SPEC, c, rank=1, world_size=2))
    assert rank1.cursor() == 10 * n

    pids = [pid for p in pipelines for pid in p.worker_pids]
    assert len(pids) == 5
    with pytest.raises(KeyError), two:  # a `with` block that raises still closes
        raise KeyError("boom")
    two.close()  # idempotent
    one.close()
    del rank1, pipelines, p  # no close: the finalizer runs at garbage collection
    gc.collect()
    assert all(gone(pid) for pid in pids), [pid for pid in pids if not gone(pid)]
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids), "closed workers are reaped"
    with pytest.raises(RuntimeError, match="closed"):
        two.next_batch()


@pytest.mark.timeout(60)
def test_worker_failures_surface_as_errors_not_hangs() -> None:
    n = SPEC.batch_size
    # Batch 3 (cursor 3n) belongs to worker 1 of 2; batches 0-2 still arrive in order.
    failing = DataPipeline(SPEC, num_workers=2, inject_failure_at=3 * n)
    slow = DataPipeline(SPEC, num_workers=1, startup_latency_s=60)
    stuck = DataPipeline(SPEC, num_workers=1, startup_latency_s=60)
    failing.start()
    slow.start()
    try:
        for k in range(3):
            assert failing.next_batch(timeout=30).cursor_start == k * n
        with pytest.raises(RuntimeError, match=rf"data worker 1 .*cursor {3 * n}") as info:
            failing.next_batch(timeout=30)
        assert "injected failure" in str(info.value)
        with pytest.raises(RuntimeError, match=rf"data worker 1 .*cursor {3 * n}"):
            failing.next_batch(timeout=30)  # a failed pipeline stays failed

        # close() from another thread ends a wait for a batch that will never come.
        threading.Timer(0.3, stuck.close).start()
        with pytest.raises(RuntimeError, match="closed while waiting"):
            stuck.wait_ready(timeout=30)

        with pytest.raises(TimeoutError, match="cursor 0"):
            slow.wait_ready(timeout=0.3)
        os.kill(slow.worker_pids[0], signal.SIGKILL)  # e.g. the OOM killer
        with pytest.raises(RuntimeError, match=r"data worker 0 .*died.*cursor 0"):
            slow.wait_ready(timeout=30)
    finally:
        pids = failing.worker_pids + slow.worker_pids + stuck.worker_pids
        t = time.monotonic()
        failing.close()
        slow.close()  # also prompt while a worker sits in its startup latency
        assert time.monotonic() - t < 5
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)


_CHILD = """
import os, signal, sys
from airflow_ett.trainer.data_gen import ClickLogSpec
from airflow_ett.trainer.data_workers import WorkerPool
spec = ClickLogSpec(seed=1, num_dense=2, tables=(("a", 10),), ids_per_feature=1, batch_size=4)
pool = WorkerPool(spec, start_cursor=0, num_workers=2, prefetch=1, rank=0, world_size=1)
pool.start()
pool.get(timeout=30)
print(" ".join(map(str, pool.pids)), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
# "exit": leave without close(); the queues are full, so workers are blocked in put()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_workers_do_not_outlive_their_parent(how: str) -> None:
    """Interpreter exit without close(), and SIGKILL of the trainer: no orphans left."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, how], capture_output=True, text=True, timeout=30
    )
    pids = [int(p) for p in proc.stdout.split()]
    assert len(pids) == 2, proc.stderr
    assert proc.returncode == (-signal.SIGKILL if how == "kill" else 0), proc.stderr
    assert wait_gone(pids, within=5.0), "orphaned data workers still running"
