"""A bare training loop as a trainer process: `job()` around it, as any adapter's trainer
runs under the train task (the environment says the job, the attempt, where events go and,
for the tracing tests, the trace context).

usage: python _traced_loop.py RESTORE_TO FAIL_AT STEPS [KILL_AT]

It restores step RESTORE_TO (cursor 10 per step), saves every 5 steps and raises after
step FAIL_AT (0: never); with KILL_AT, it flushes what it recorded after that step and
SIGKILLs itself (a lost host: no end, no attempt span).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from airflow_ett.adapters import job

PER_STEP, EVERY = 10, 5


def main() -> None:
    restore_to, fail_at, steps = (int(a) for a in sys.argv[1:4])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    with job() as ett:
        with ett.phase("model_creation"):
            time.sleep(0.02)
        with ett.phase("checkpoint_restore"):
            time.sleep(0.01)
        step = restore_to
        ett.resumed(step, step * PER_STEP)
        while step < steps:
            ett.begin_step()
            time.sleep(0.005)
            step += 1
            ett.step(step, step * PER_STEP)
            if step == fail_at:
                raise RuntimeError(f"injected at step {step}")
            if step == kill_at:
                ett.emitter.flush(10.0)  # the phases so far, exported: then no word
                os.kill(os.getpid(), signal.SIGKILL)
            if step % EVERY == 0:
                with ett.checkpoint(step, step * PER_STEP):
                    time.sleep(0.01)


if __name__ == "__main__":
    main()
