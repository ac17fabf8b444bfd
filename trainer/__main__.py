"""`python -m airflow_ett.trainer --config FILE`: one attempt of a training job.

Runs alone or under torchrun (`torchrun --nproc-per-node 2 -m airflow_ett.trainer ...`).
Job and attempt ids come from the arguments or the environment (`ETT_JOB_ID`,
`ETT_ATTEMPT_ID`, `ETT_ATTEMPT_NUMBER`), which is how the Airflow operator passes them.
Exit codes: 0 done, 1 application error, 75 preempted and checkpointed (resumable),
78 bad configuration (retrying will not help). `kill -USR1 <pid>` prints every thread's
stack to stderr, and the attempt goes on.

Under a launcher that sets `ETT_EXIT_DIR` (ours does under torchrun, which hides every
rank's exit code behind its own 1), each rank also leaves an exit record there
(`protocol.exits.ExitRecord`): how it ended, for `trainer/rank_failures.py` to find the root
cause of a multi-rank failure.
"""

from __future__ import annotations

import time

_PROCESS_START = time.time()  # before torch is imported: trainer_init starts here

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from typing import NoReturn  # noqa: E402

# imports the stdlib alone at run time: cheap enough before the arguments are read
from airflow_ett.protocol.exits import (  # noqa: E402
    EXIT_APPLICATION,
    EXIT_BAD_CONFIG,
    die_on_sigterm_recorded,
    exit_record,
)


class _Parser(argparse.ArgumentParser):
    """A bad argument is a bad config: one line and exit 78 (argparse's own exit 2
    reads as an application failure, which is retried)."""

    def error(self, message: str) -> NoReturn:
        print(f"trainer: error: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_CONFIG)


def _env_attempt_number() -> int | str:
    raw = os.environ.get("ETT_ATTEMPT_NUMBER", "1")
    return int(raw) if raw.strip().isdigit() else raw


def main(argv: list[str] | None = None) -> int:
    """One attempt (of this rank); its exit, however it comes, goes into the exit record."""
    exit_record.start()
    if exit_record.active:
        die_on_sigterm_recorded()
    code, error = EXIT_APPLICATION, None
    try:
        code = _main(argv)
        return code
    except SystemExit as exc:
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else (
            EXIT_APPLICATION)
        raise
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        exit_record.exit(code, error)


def _world_size() -> int:
    raw = os.environ.get("WORLD_SIZE", "1")
    return int(raw) if raw.strip().isdigit() and int(raw) > 0 else 1


def _main(argv: list[str] | None) -> int:
    parser = _Parser(
        prog="python -m airflow_ett.trainer", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--config", required=True, help="trainer config (TOML or JSON)")
    parser.add_argument("--job-id", default=os.environ.get("ETT_JOB_ID"))
    parser.add_argument("--attempt-id", default=os.environ.get("ETT_ATTEMPT_ID"))
    parser.add_argument("--attempt-number", type=int, default=None)
    parser.add_argument(
        "--prewarm",
        action="store_true",
        help="compile on the fast batch, save the compile cache, exit",
    )
    parser.add_argument(
        "--prewarm-world-size", type=int, default=None,
        help="with --prewarm: compile for a job of this many processes (the cache key)",
    )
    parser.add_argument(
        "--standby",
        action="store_true",
        help="a warm spare for the next attempt: warm up, then wait for 'go <unix time>' on "
             "standard input (the launcher's; see airflow_ett/trainer/standby.py)",
    )
    parser.add_argument("--log-level", default=os.environ.get("ETT_LOG_LEVEL", "INFO"))
    args = parser.parse_args(argv)
    if args.standby and (args.prewarm or _world_size() > 1):
        print("trainer: error: --standby is one process of a training attempt: not with "
              "--prewarm, not under torchrun", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.standby:
        from airflow_ett.trainer.standby import lower_priority

        lower_priority()  # before anything heavy runs: every thread inherits it
    if args.attempt_number is None:
        args.attempt_number = _env_attempt_number()
    if not isinstance(args.attempt_number, int) or args.attempt_number < 1:
        print(f"trainer: error: --attempt-number (or ETT_ATTEMPT_NUMBER) = "
              f"{args.attempt_number!r}: must be an integer >= 1", file=sys.stderr)
        return EXIT_BAD_CONFIG
    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        print(f"trainer: error: --log-level (or ETT_LOG_LEVEL) = {args.log_level!r}: must be "
              "DEBUG, INFO, WARNING or ERROR", file=sys.stderr)
        return EXIT_BAD_CONFIG
    # Our loggers at the chosen level; everything else (fbgemm logs each library it
    # loads at INFO on the root logger) only from WARNING up.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_ett").setLevel(level)

    from airflow_ett.trainer import TorchRecMissingError, require_torchrec
    from airflow_ett.trainer.config import ConfigError, check_fault_ranks, load_config
    from airflow_ett.trainer.preflight import preflight

    try:
        # before any allocation, compile or restore, and before torch and torchrec are
        # imported (2-3 s of a refusal, per rank): what cannot work fails in a line
        cfg = load_config(args.config)
        check_fault_ranks(cfg.faults, _world_size())
        preflight(cfg, prewarm=args.prewarm, prewarm_world_size=args.prewarm_world_size)
        require_torchrec()
    except (ConfigError, TorchRecMissingError) as exc:
        print(f"trainer: error: {exc}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    from airflow_ett.trainer.identity import Identity
    from airflow_ett.trainer.run import run

    job_id = args.job_id or f"standalone-{int(_PROCESS_START)}"
    ident = Identity(job_id, args.attempt_id or str(args.attempt_number), args.attempt_number)
    return run(cfg, ident, process_start=_PROCESS_START, prewarm=args.prewarm,
               prewarm_world_size=args.prewarm_world_size,
               standby=sys.stdin if args.standby else None)


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's teardown. By the time `main` returns, everything
    that matters is done: the final checkpoint committed, the data workers and the
    checkpoint writer closed, the events delivered or spooled (`run.run` closes the
    emitter), the exit record written. What is left is Python unwinding torch and
    torchrec module by module, which took 1.0 s on an idle 2-core machine (bench/RESULTS.md,
    "Shutdown"), and the allocation stays held for all of it: the GPUs of a finished
    job, or the restart of a failed one, wait on a process that is only tidying up."""
    try:
        compiler = sys.modules.get("torch._inductor.async_compile")
        if compiler is not None:  # its worker processes: stopped, not left to notice
            compiler.shutdown_compile_workers()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's Python stack to stderr, and the attempt goes
    on: where a rank that stopped moving stands (the watchdog says *that* it hung, and
    ends it; this says *where*, while it still can). Written from the signal handler in C,
    so it answers with the GIL held by a thread stuck in a collective."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def _run_as_program() -> NoReturn:
    _stacks_on_sigusr1()
    try:
        code = main()
    except SystemExit as exc:  # argparse's --help, say
        code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else (
            EXIT_APPLICATION)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # as the interpreter would: the traceback, exit 1
        traceback.print_exc()
        code = EXIT_APPLICATION
    exit_now(code)


if __name__ == "__main__":
    _run_as_program()
