"""Publishing: a real (short, in-process) training run's newest committed checkpoint becomes
`<out>/<model>/v<N>/` with safetensors weights and a manifest that says exactly what they
are; versions are never shared or half-visible, LATEST only moves forward, and a damaged
artifact is refused by name.

The module trains `dlrm_tiny` once (6 steps, checkpoints at 3 and 6, compile off: about a
second) and every test publishes from it, or from a copy it may damage.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from airflow_ett.emit import Emitter
from airflow_ett.trainer.checkpoint import (
    COMMIT_MARKER,
    CheckpointManager,
    CommitMarker,
    read_marker,
)
from airflow_ett.trainer.config import ConfigError, TrainerConfig, config_from_mapping
from airflow_ett.trainer.data import ClickLogSpec, make_batch
from airflow_ett.trainer.final_state import load_final_state
from airflow_ett.trainer.identity import DistEnv, Identity
from airflow_ett.trainer.loop import Trainer
from airflow_ett.trainer.model import build_for
from airflow_ett.trainer.model_config import BUNDLED
from airflow_ett.trainer.publish import (
    NoCheckpointError,
    _advance_latest,
    _allocate,
    build_published_model,
    load_published,
    main,
    publish_model,
)
from airflow_ett.trainer.publish_manifest import (
    FORMAT_VERSION,
    LATEST,
    MANIFEST,
    RUN_FIELDS,
    WEIGHTS,
    IntegrityError,
    NotPublishedError,
    PublishError,
    read_manifest,
)
from airflow_ett.trainer.state import TrainState
from tests.hostile import deep_json, huge, in_thread, not_utf8

JOB = {
    "model": "dlrm_tiny", "steps": 6, "batch_size": 32, "checkpoint_interval": 3,
    "num_workers": 0, "compile": False, "seed": 11, "lr_dense": 0.1,
}


def train(directory: Path) -> TrainerConfig:
    """A real training run, in this process, the way `run.run` drives one attempt."""
    cfg = config_from_mapping({**JOB, "checkpoint_dir": str(directory / "ckpt")})
    emitter = Emitter("publish-test", "1", disabled=True)
    trainer = Trainer(cfg, Identity("publish-test", "1", 1),
                      DistEnv(0, 1, 0, torch.device("cpu")), emitter, time.time())
    try:
        assert trainer.train(trainer.start()) == 0
        trainer.finish()
    finally:
        trainer.close()
        emitter.close()
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainerConfig:
    return train(tmp_path_factory.mktemp("run"))


@pytest.fixture
def copy_of(trained: TrainerConfig, tmp_path: Path) -> TrainerConfig:
    """The trained run's checkpoints, copied for a test that damages them."""
    target = tmp_path / "ckpt-copy"
    shutil.copytree(trained.checkpoint_dir, target)
    return replace(trained, checkpoint_dir=target)


def newest_marker(cfg: TrainerConfig) -> CommitMarker:
    latest = CheckpointManager(cfg.checkpoint_dir, async_save=False).latest()
    assert latest is not None
    return read_marker(latest)


def predict(module: Any, cfg: TrainerConfig) -> torch.Tensor:
    """Logits on a batch the run never trained on (cursor far past its 6 x 32 samples)."""
    m = cfg.data.schema
    spec = ClickLogSpec(seed=cfg.seed, num_dense=m.num_dense, tables=m.tables,
                        ids_per_feature=cfg.data.ids_per_feature, batch_size=cfg.batch_size)
    batch = make_batch(spec, 100_000)
    with torch.no_grad():
        logits: torch.Tensor = module.model(batch.dense, batch.sparse)
    return logits


# -- publishing --------------------------------------------------------------------------


def test_publish_writes_a_whole_version_its_manifest_and_latest(
    trained: TrainerConfig, tmp_path: Path
) -> None:
    published = publish_model(trained, tmp_path / "models", metrics={"auc": 0.71, "n": 3},
                              ett_summary={"ett_pct": 64.5}, extra={"dag_run": "r1"})
    model_dir = tmp_path / "models" / "dlrm_tiny"
    assert published.version == 1 and published.path == model_dir / "v1"
    assert sorted(p.name for p in published.path.iterdir()) == [MANIFEST, WEIGHTS]
    assert (model_dir / LATEST).read_text() == "v1\n"
    # safetensors writes 0600 temp files; the artifact is for others to read
    assert published.weights_path.stat().st_mode == published.manifest_path.stat().st_mode
    assert not [p for p in model_dir.iterdir() if p.name.endswith(".partial")]

    manifest = json.loads(published.manifest_path.read_text())
    assert manifest == published.manifest
    marker = newest_marker(trained)
    assert manifest["checkpoint"]["step"] == marker.step == 6
    assert manifest["checkpoint"]["cursor"] == marker.extra["cursor"] == 6 * 32
    assert manifest["checkpoint"]["world_size"] == 1
    assert (published.step, published.cursor) == (6, 6 * 32)
    assert manifest["checkpoint"]["skipped"] == []
    assert manifest["format_version"] == FORMAT_VERSION and manifest["version"] == 1
    assert manifest["model"] == {
        "name": "dlrm_tiny", "factory": "airflow_ett.trainer.models.dlrm:build",
        "config": dict(trained.model.config), "code": trained.model.code,
        "identity": trained.model_identity, "code_path": None,
        "schema": trained.data.schema.to_dict()}
    assert manifest["run"] == {f: getattr(trained, f) for f in RUN_FIELDS}
    assert manifest["run"]["lr_dense"] == 0.1 and manifest["run"]["seed"] == 11
    assert manifest["torch"] == torch.__version__
    created = datetime.fromisoformat(manifest["created_at"])
    assert created.utcoffset() == timedelta(0)
    assert abs((datetime.now(created.tzinfo) - created).total_seconds()) < 60
    assert manifest["metrics"] == {"auc": 0.71, "n": 3}
    assert manifest["ett_summary"] == {"ett_pct": 64.5}
    assert manifest["extra"] == {"dag_run": "r1"}

    weights = manifest["weights"]
    data = published.weights_path.read_bytes()
    assert weights["sha256"] == hashlib.sha256(data).hexdigest()
    assert weights["file_bytes"] == len(data)
    tensors, _ = load_published(published.path)
    assert weights["tensors"] == len(tensors) == 11
    assert weights["tensor_bytes"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert weights["dtypes"] == {"float32": 11}


def test_rebuilt_model_predicts_bitwise_like_the_model_restored_from_the_checkpoint(
    trained: TrainerConfig, tmp_path: Path
) -> None:
    published = publish_model(trained, tmp_path)
    # the trainer's own restore: full TrainState (model and optimizer), as on a restart
    restored = build_for(trained).module
    optimizer = torch.optim.Adagrad(restored.parameters(), lr=trained.lr_dense)
    with CheckpointManager(trained.checkpoint_dir, async_save=False) as manager:
        result = manager.restore({"train": TrainState(restored, {"all": optimizer},
                                                      sharded=False)})
    assert result is not None and result.step == 6
    rebuilt = build_published_model(tmp_path / "dlrm_tiny")
    assert not rebuilt.training
    want, got = predict(restored, trained), predict(rebuilt, trained)
    assert want.shape == (trained.batch_size, 1)
    assert torch.equal(want, got)
    # and the weights themselves, through every reader
    tensors, _ = load_published(published.path)
    final = load_final_state(trained)
    for name, value in restored.state_dict().items():
        assert torch.equal(tensors[name], value), name
        assert torch.equal(final[name], value), name
    # trained weights, not the initial ones
    fresh = build_for(trained).module.state_dict()
    assert any(not torch.equal(fresh[k], tensors[k]) for k in fresh)


def test_second_publish_is_v2_and_latest_follows(trained: TrainerConfig, tmp_path: Path) -> None:
    first = publish_model(trained, tmp_path, metrics={"auc": 0.5})
    second = publish_model(trained, tmp_path, metrics={"auc": 0.6})
    assert (first.version, second.version) == (1, 2)
    assert (tmp_path / "dlrm_tiny" / LATEST).read_text() == "v2\n"
    _, manifest = load_published(tmp_path / "dlrm_tiny")
    assert manifest["version"] == 2 and manifest["metrics"] == {"auc": 0.6}
    _, old = load_published(first.path)
    assert old["version"] == 1 and old["metrics"] == {"auc": 0.5}
    assert old["weights"]["sha256"] == manifest["weights"]["sha256"]  # same checkpoint


def test_publish_falls_back_past_a_damaged_newest_checkpoint(
    copy_of: TrainerConfig, tmp_path: Path
) -> None:
    newest = copy_of.checkpoint_dir / "step-0000000006"
    data = next(p for p in sorted(newest.iterdir()) if p.suffix == ".distcp")
    data.write_bytes(data.read_bytes()[:10])
    published = publish_model(copy_of, tmp_path / "out")
    checkpoint = published.manifest["checkpoint"]
    assert checkpoint["step"] == 3 and checkpoint["cursor"] == 3 * 32
    assert [s["path"] for s in checkpoint["skipped"]] == [str(newest)]
    assert "bytes" in checkpoint["skipped"][0]["reason"]


class _Boom:
    """Pickles as os.system("touch <marker>"): code a plain pickle.load would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_metadata_pickle_runs_no_code_on_the_publish_host(
    copy_of: TrainerConfig, tmp_path: Path
) -> None:
    """Whoever can write the checkpoint dir can replace .metadata with a pickle and rewrite
    the commit marker to match (a CRC is not authentication). Publishing must refuse that
    checkpoint by name and publish the older one, without running the pickle."""
    import pickle
    import zlib

    newest = copy_of.checkpoint_dir / "step-0000000006"
    ran = tmp_path / "the-attacker-code-ran"
    crafted = pickle.dumps(_Boom(ran))
    (newest / ".metadata").write_bytes(crafted)
    marker = json.loads((newest / COMMIT_MARKER).read_text())
    marker["files"][".metadata"] = {"size": len(crafted), "crc32": f"{zlib.crc32(crafted):08x}"}
    (newest / COMMIT_MARKER).write_text(json.dumps(marker))
    published = publish_model(copy_of, tmp_path / "out")
    assert not ran.exists()
    checkpoint = published.manifest["checkpoint"]
    assert checkpoint["step"] == 3
    assert [s["path"] for s in checkpoint["skipped"]] == [str(newest)]
    assert "forbidden global posix.system" in checkpoint["skipped"][0]["reason"]


# -- refusals ----------------------------------------------------------------------------


def test_a_damaged_weights_file_is_refused_naming_it(
    trained: TrainerConfig, tmp_path: Path
) -> None:
    published = publish_model(trained, tmp_path)
    with published.weights_path.open("r+b") as fh:  # one bit, same size
        fh.seek(os.path.getsize(published.weights_path) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0x01]))
    for read in (load_published, build_published_model):
        with pytest.raises(IntegrityError, match="sha256") as caught:
            read(tmp_path / "dlrm_tiny")
        assert str(published.weights_path) in str(caught.value)
        assert isinstance(caught.value, PublishError | ValueError)


def test_no_committed_checkpoint_is_a_clear_error(copy_of: TrainerConfig, tmp_path: Path) -> None:
    out = tmp_path / "out"
    missing = replace(copy_of, checkpoint_dir=tmp_path / "never-trained")
    with pytest.raises(NoCheckpointError, match="never-trained") as caught:
        publish_model(missing, out)
    assert isinstance(caught.value, FileNotFoundError)
    assert not missing.checkpoint_dir.exists()  # a reader creates nothing

    for step_dir in copy_of.checkpoint_dir.glob("step-*"):
        (step_dir / COMMIT_MARKER).unlink()  # saves that never committed
    with pytest.raises(NoCheckpointError) as caught:
        publish_model(copy_of, out)
    assert f"no committed checkpoint in {copy_of.checkpoint_dir}" in str(caught.value)
    assert "2 step directories" in str(caught.value)
    assert not out.exists()


def test_the_manifest_reads_back_as_its_writer_wrote_it(trained: TrainerConfig,
                                                       tmp_path: Path) -> None:
    published = publish_model(trained, tmp_path, metrics={"auc": 0.5},
                              ett_summary={"ett_pct": 60.0}, extra={"who": [1, "a"]})
    assert read_manifest(published.path) == published.manifest
    assert load_published(published.path)[1] == published.manifest


@pytest.mark.parametrize(("where", "value", "says"), [
    (("weights", "tensors"), "11", "weights.tensors = '11': must be an integer >= 0"),
    (("checkpoint", "cursor"), -1, "checkpoint.cursor = -1: must be >= 0"),
    (("run", "seed"), 1.5, "run.seed = 1.5: must be an integer >= 0"),
    (("model", "factory"), None,
     "bad model description: model: factory = None: must be a string"),
])
def test_a_damaged_manifest_field_is_named_with_its_value(
        trained: TrainerConfig, tmp_path: Path, where: tuple[str, str], value: object,
        says: str) -> None:
    published = publish_model(trained, tmp_path)
    manifest = json.loads(published.manifest_path.read_text())
    manifest[where[0]][where[1]] = value
    published.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError) as caught:
        load_published(published.path)
    assert str(caught.value) == f"{published.manifest_path}: {says}"


def test_reading_what_was_never_published_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(NotPublishedError, match=str(tmp_path / "nothing")):
        load_published(tmp_path / "nothing")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / LATEST).write_text("v7\n")
    with pytest.raises(IntegrityError, match="names v7"):
        load_published(tmp_path / "m")


@pytest.mark.parametrize(("kind", "make"), [("huge", huge), ("deep", deep_json),
                                            ("not_utf8", not_utf8)])
def test_a_hostile_manifest_or_latest_is_an_integrity_error(
        tmp_path: Path, kind: str, make: Any) -> None:
    """Whoever serves a model reads these: read bounded, one line naming the file."""
    version = tmp_path / "m" / "v1"
    version.mkdir(parents=True)
    says = make(version / MANIFEST)
    with pytest.raises(IntegrityError, match=f"{MANIFEST}: unreadable: {says}"):
        in_thread(lambda: load_published(version))
    make(tmp_path / "m" / LATEST)  # LATEST is `v<N>`: anything else names no version
    with pytest.raises(IntegrityError, match="does not name a version"):
        in_thread(lambda: load_published(tmp_path / "m"))


def test_caller_metadata_is_checked_before_any_work(copy_of: TrainerConfig,
                                                    tmp_path: Path) -> None:
    gone = replace(copy_of, checkpoint_dir=tmp_path / "absent")  # would fail later
    bad: list[dict[str, Any]] = [
        {"metrics": {"auc": float("nan")}},
        {"metrics": {"auc": "0.7"}},
        {"ett_summary": {"x": float("inf")}},
        {"extra": {"when": datetime.now()}},
    ]
    for kwargs in bad:
        with pytest.raises(PublishError) as caught:
            publish_model(gone, tmp_path / "out", **kwargs)
        assert not isinstance(caught.value, NoCheckpointError), kwargs
    assert not (tmp_path / "out").exists()
    with pytest.raises(PublishError, match="cannot name a directory"):
        publish_model(replace(copy_of, model=replace(copy_of.model, name="../up")), tmp_path)


# -- concurrency -------------------------------------------------------------------------


def test_concurrent_publishers_get_distinct_versions(
    trained: TrainerConfig, tmp_path: Path
) -> None:
    start = threading.Barrier(4)
    versions: list[int] = []
    errors: list[BaseException] = []

    def publisher(i: int) -> None:
        try:
            start.wait(10)
            versions.append(publish_model(trained, tmp_path, extra={"who": i}).version)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publisher, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(versions) == [1, 2, 3, 4]
    model_dir = tmp_path / "dlrm_tiny"
    assert (model_dir / LATEST).read_text() == "v4\n"
    assert sorted(p.name for p in model_dir.iterdir() if not p.name.startswith(".")) == [
        LATEST, "v1", "v2", "v3", "v4"]
    assert {load_published(model_dir / f"v{n}")[1]["extra"]["who"] for n in versions} == {
        0, 1, 2, 3}


def test_racing_allocations_never_share_a_number(tmp_path: Path) -> None:
    """Many allocators at once, each publishing (renaming) as soon as it has its number,
    so that some list the versions before others' renames and some after."""
    start = threading.Barrier(16)
    got: list[int] = []

    def allocator() -> None:
        start.wait(10)
        for _ in range(5):
            number, tmp = _allocate(tmp_path)
            os.rename(tmp, tmp_path / f"v{number}")
            got.append(number)

    threads = [threading.Thread(target=allocator) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == list(range(1, 81))
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_a_crashed_publishers_number_is_skipped_and_latest_never_moves_back(
    trained: TrainerConfig, tmp_path: Path
) -> None:
    model_dir = tmp_path / "dlrm_tiny"
    model_dir.mkdir()
    (model_dir / ".v1.partial").mkdir()  # died half-way through writing v1
    published = publish_model(trained, tmp_path)
    assert published.version == 2
    assert load_published(model_dir)[1]["version"] == 2
    # a slower publisher that got v1 finishing now must not take LATEST back
    _advance_latest(model_dir, 1)
    assert (model_dir / LATEST).read_text() == "v2\n"
    _advance_latest(model_dir, 3)
    assert (model_dir / LATEST).read_text() == "v3\n"


# -- command line ------------------------------------------------------------------------


def test_cli_publishes_and_prints_the_version(
    trained: TrainerConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "job.json"
    config.write_text(json.dumps({**JOB, "checkpoint_dir": str(trained.checkpoint_dir)}))
    out = tmp_path / "models"
    assert main(["--config", str(config), "--out", str(out), "--metrics", '{"auc": 0.7}']) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(out / "dlrm_tiny" / "v1")
    assert load_published(Path(printed))[1]["metrics"] == {"auc": 0.7}
    assert main(["--config", str(config), "--out", str(out), "--metrics", "[1]"]) == 78
    assert main(["--config", str(tmp_path / "nope.json"), "--out", str(out)]) == 78
    config.write_text(json.dumps({**JOB, "checkpoint_dir": str(tmp_path / "empty")}))
    assert main(["--config", str(config), "--out", str(out)]) == 1
    assert "nothing to publish" in capsys.readouterr().err


# -- several ranks -----------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.skipif(not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")
def test_a_two_rank_sharded_checkpoint_publishes_its_whole_tables(tmp_path: Path) -> None:
    """Two ranks on CPU (gloo) shard the tables and give them a fused optimizer; the
    published weights are the checkpoint's model tensors, reassembled whole."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    config = tmp_path / "job.json"
    # events to a file of its own: nothing reaches the session's store or spool
    config.write_text(json.dumps({**JOB, "checkpoint_dir": "ckpt",
                                  "events_file": "events.jsonl"}))
    done = subprocess.run(
        [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node",
         "2", "-m", "airflow_ett.trainer", "--config", str(config), "--job-id", "pub2"],
        capture_output=True, text=True, timeout=240, check=False, cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    cfg = config_from_mapping({**JOB, "checkpoint_dir": str(tmp_path / "ckpt")})
    published = publish_model(cfg, tmp_path / "models")
    assert published.manifest["checkpoint"]["world_size"] == 2
    assert published.manifest["checkpoint"]["step"] == 6
    dcp_to_torch_save(tmp_path / "ckpt" / "step-0000000006", tmp_path / "whole.pt")
    want = torch.load(tmp_path / "whole.pt", weights_only=True)["train"]["model"]
    got, _ = load_published(published.path)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    build_published_model(published.path)  # strict load into an unsharded DLRM


def test_another_models_checkpoints_are_a_bad_config_not_a_retryable_failure(
    copy_of: TrainerConfig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The trainer's preflight rule holds for publishing too: a job whose checkpoint_dir
    holds another model's checkpoints fails in one line and exit 78, before any restore,
    instead of a shape error a retry would repeat."""
    bigger = {**BUNDLED["dlrm_tiny"].to_dict(), "num_dense": copy_of.data.schema.num_dense + 1}
    other = config_from_mapping({**JOB, "checkpoint_dir": str(copy_of.checkpoint_dir),
                                 "model": bigger})
    with pytest.raises(ConfigError, match="holds checkpoints of another model") as caught:
        publish_model(other, tmp_path / "out")
    assert "checkpoint_dir" in str(caught.value)
    assert not (tmp_path / "out").exists()

    config = tmp_path / "other.json"
    config.write_text(json.dumps({**JOB, "checkpoint_dir": str(copy_of.checkpoint_dir),
                                  "model": bigger}))
    assert main(["--config", str(config), "--out", str(tmp_path / "out")]) == 78
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "another model" in err
    # the checkpoints are untouched: the model they belong to still publishes
    assert publish_model(copy_of, tmp_path / "out").version == 1
