"""The Airflow components an end-to-end test starts.

No task of ours defers (nothing in airflow_ett hands work to a trigger), so the tests'
Airflows run without the triggerer: a process per test tier that would only heartbeat
(about 3 CPU-s to start and its idle polling beside every other test). The embedded
default keeps it for users' own deferrable tasks; tests/embedded checks that default.
"""

from __future__ import annotations

WITHOUT_TRIGGERER = ("dag-processor", "scheduler", "api-server")
