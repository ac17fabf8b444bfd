"""A bare training loop as a trainer process: `job()` around it, as any adapter's trainer
runs under the train task (the environment says the job, the attempt, where events go and,
for the tracing tests, the trace context).

usage: python _traced_loop.py RESTORE_TO FAIL_AT STEPS

It restores step RESTORE_TO (cursor 10 per step), saves every 5 steps and raises after
step FAIL_AT (0: never).
"""

from __future__ import annotations

import sys
import time

from airflow_ett.adapters import job

PER_STEP, EVERY = 10, 5


def main() -> None:
    restore_to, fail_at, steps = (int(a) for a in sys.argv[1:4])
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
            if step % EVERY == 0:
                with ett.checkpoint(step, step * PER_STEP):
                    time.sleep(0.01)


if __name__ == "__main__":
    main()
