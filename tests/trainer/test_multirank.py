"""Multi-rank attempts under torchrun, through the launcher the operator uses: the root
cause of a failure comes from the ranks' exit records, not torchrun's exit code (1 for
any failed rank). Each torchrun start costs several seconds on 2 cores: few, short runs.
Also the multi-node command (docs/multi-node.md), checked without starting anything.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

import pytest

from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.events import CheckpointSaved, RankSteps, read_events
from airflow_ett.operators.errors import failure_for
from airflow_ett.trainer.launcher import Rendezvous, run_attempts, trainer_command
from tests.trainer.test_trainer_e2e import write_config

TORCHRUN = Path(sys.executable).with_name("torchrun")
F = TypeVar("F", bound=Callable[..., None])


def torchrun_job(test: F) -> F:
    """The marks of a test that starts torchrun (several seconds per start)."""
    for mark in (pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240),
                 pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed")):
        test = mark(test)
    return test


def test_a_multi_node_command_joins_a_c10d_rendezvous_instead_of_standalone() -> None:
    rdzv = Rendezvous(nnodes=2, endpoint="head-0:29400", run_id="ranking__run1.1.1")
    cmd = trainer_command("job.toml", nproc=8, python="/v/bin/python", rendezvous=rdzv)
    assert cmd[:10] == ["/v/bin/torchrun", "--nnodes", "2", "--rdzv-backend", "c10d",
                        "--rdzv-endpoint", "head-0:29400", "--rdzv-id", "ranking__run1.1.1",
                        "--nproc-per-node"]
    assert "--standalone" not in cmd and cmd[10] == "8"
    # one rank per node is still torchrun: the agents must meet
    assert trainer_command("job.toml", python="/p", rendezvous=rdzv)[0] == "/torchrun"


@pytest.mark.parametrize(("fields", "message"), [
    ({"nnodes": 1}, "nnodes = 1: must be an integer >= 2"),
    ({"nnodes": True}, "nnodes = True"),
    ({"endpoint": "head-0"}, "rdzv_endpoint = 'head-0': must be host:port"),
    ({"endpoint": ":29400"}, "rdzv_endpoint = ':29400'"),
    ({"endpoint": "h:70000"}, "rdzv_endpoint = 'h:70000'"),
    ({"run_id": ""}, "rdzv_id = ''"),
    ({"run_id": "a b"}, "rdzv_id = 'a b'"),
])
def test_a_bad_rendezvous_names_the_field_and_value(fields: dict[str, object],
                                                    message: str) -> None:
    args: dict[str, object] = {"nnodes": 2, "endpoint": "h:29400", "run_id": "j.1", **fields}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Rendezvous(**args)  # type: ignore[arg-type]


def launch(tmp_path: Path, faults: list[dict[str, object]], *, max_attempts: int = 1,
           steps: int = 12, **fields: object) -> tuple[object, list[str]]:
    config = write_config(tmp_path / "job.json", steps=steps, faults=faults, **fields)
    lines: list[str] = []
    result = run_attempts(config, "multirank", max_attempts=max_attempts, nproc=2,
                          cwd=tmp_path, env={"OMP_NUM_THREADS": "1"}, on_output=lines.append,
                          timeout=180.0)
    return result, lines


@torchrun_job
def test_a_sigkilled_rank_is_infra_and_its_peer_is_not_the_cause(tmp_path: Path) -> None:
    result, lines = launch(tmp_path, [{"kind": "kill", "at_step": 3, "rank": 1}])
    last = result.last  # type: ignore[attr-defined]
    log = "\n".join(lines)[-3000:]
    assert last.exit_code == 1, log  # torchrun's word for any failed rank
    cls = last.exit_class
    assert (cls.cause, cls.retryable, cls.reported_by_child) == ("infra", True, False), log
    assert failure_for(cls.cause).__name__ == "TrainerInfraFailure"
    rank0, rank1 = last.ranks
    assert rank1.exit_code is None  # SIGKILLed: no word
    # the survivor failed on its own (its peer gone), or left on torchrun's SIGTERM:
    # either way it recorded an exit, which is not the cause
    assert rank0.exit_code not in (None, 0), last.ranks


@torchrun_job
def test_a_bad_fault_rank_is_a_bad_config_on_every_rank_and_not_retried(
        tmp_path: Path) -> None:
    result, lines = launch(tmp_path, [{"kind": "raise", "at_step": 3, "rank": 2}],
                           max_attempts=2)
    log = "\n".join(lines)
    assert len(result.attempts) == 1, log  # not restarted: a retry cannot heal it
    cls = result.last.exit_class  # type: ignore[attr-defined]
    assert (cls.cause, cls.retryable) == ("application", False), log
    assert "faults[0].rank = 2: must be below the job's world size (2)" in log
    # each rank that got to its check refused (78); torchrun may have stopped the slower
    # one first (SIGTERM: -15) once the other had exited
    codes = [r.exit_code for r in result.last.ranks]  # type: ignore[attr-defined]
    assert 78 in codes and set(codes) <= {78, -15}, codes


@torchrun_job
def test_a_time_interval_is_due_at_the_same_step_on_every_rank(tmp_path: Path) -> None:
    # Each rank reads its own clock against the end of its own last save: were each to
    # decide alone, near a boundary one rank would begin a save (its collectives) while
    # the other stepped on (its own), and the pair would hang until the timeout. A 0.1 s
    # interval over ~25 ms steps puts a boundary near every few steps.
    result, lines = launch(tmp_path, [], steps=160, checkpoint_interval="0.1s",
                           step_sleep_s=0.02)
    log = "\n".join(lines)[-3000:]
    assert result.last.exit_code == 0, log  # type: ignore[attr-defined]
    saves = [e for e in read_events(str(tmp_path / "events.jsonl")).events
             if isinstance(e, CheckpointSaved) and not e.final]
    assert len(saves) >= 5, log


@torchrun_job
def test_a_rank_slowed_on_purpose_is_named_the_straggler(tmp_path: Path) -> None:
    # Rank 1 takes 60 ms longer from step 4 on (a slow host, before the step's compute);
    # rank 0 waits for it at the probe. Every step lasts as long on both ranks: only the
    # ranks' own times, which the probe separates from their waits, tell them apart.
    result, lines = launch(tmp_path, [{"kind": "slow_steps", "at_step": 3, "seconds": 0.06,
                                       "rank": 1}], steps=60, rank_report_s=0.25,
                           checkpoint_interval=1000)
    log = "\n".join(lines)[-3000:]
    assert result.last.exit_code == 0, log  # type: ignore[attr-defined]
    events = read_events(str(tmp_path / "events.jsonl")).events
    reports = [e for e in events if isinstance(e, RankSteps)]
    assert {e.rank for e in reports} == {0, 1}, log
    for rank in (0, 1):  # each rank's reports cover every step once
        mine = sorted((e.step_start, e.step_end) for e in reports if e.rank == rank)
        assert mine[0][0] == 0 and mine[-1][1] == 60
        assert all(a[1] == b[0] for a, b in pairwise(mine))
    ranks = attribute_job(events).summary().rank_steps
    assert ranks is not None
    by_rank = {r.rank: r for r in ranks.ranks}
    assert by_rank[1].step_s > by_rank[0].step_s + 0.04, ranks
    assert by_rank[0].wait_step_s > by_rank[1].wait_step_s + 0.04, ranks
    (straggler,) = ranks.stragglers
    assert straggler.rank == 1, ranks
    assert straggler.slow_share >= 0.75 and straggler.lost_s > 0.04 * 40, ranks
