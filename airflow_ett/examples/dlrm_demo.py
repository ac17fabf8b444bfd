"""The demo job, declared once for the two DAGs that compare it with itself.

`dags/ett_dlrm_demo.py` runs it with every optimization on and
`dags/ett_dlrm_baseline.py` with every one off; the comparison is only fair when
everything else is the same, so both take their options from here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

DEMO_JOB: Final[dict[str, Any]] = {
    "tenant": "demo",
    "model": "dlrm_small",
    "steps": 400,
    "checkpoint_interval": 60,
    # SIGKILL (an infra failure nobody reports) after step 330 of the first attempt: the
    # in-place restart restores the step-300 checkpoint and replays 30 steps.
    "faults": [{"kind": "kill", "at_step": 330, "attempt": 1}],
    "retries": 2,
    "retry_delay": timedelta(seconds=5),
    "restarts": 1,
    # 20 ms per step stands in for a bigger model's step time on this CPU model;
    # the data pipeline takes 2 s to start, as a remote one would; a step that has not
    # finished after a minute is a hang (the watchdog restarts the attempt).
    "trainer_options": {"batch_size": 256, "step_sleep_s": 0.02,
                        "data_startup_latency_s": 2.0, "hang_timeout_s": 60.0},
}

ALL_OFF: Final[dict[str, bool]] = {
    name: False for name in ("fast_batch", "parallel_init", "compile_cache",
                             "async_checkpoint", "warm_standby", "standalone_publish")
}
