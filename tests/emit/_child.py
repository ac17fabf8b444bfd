"""A trainer-like child process for the process-level tests.

usage: python _child.py SINK SPOOL_DIR JOB N [fork]

SINK is a store URL or `jsonl:PATH`. Emits N progress events and exits normally without
flush or close, so delivery rests on the atexit hook. With `fork`, the process forks
after its first half, and the child emits the second half, flushes and leaves through
os._exit, as multiprocessing and task runners do. CHILD_EMIT_TIMEOUT (seconds, default 1)
is the emitter's timeout: the tests of a store that is down or hung keep 1 s to see the
exit come promptly; those of a store that answers give it time to answer under load.
"""

from __future__ import annotations

import os
import sys

from airflow_ett.emit import Emitter, JsonlSink
from airflow_ett.emit.sinks import EventSink

T = 1_795_856_000.0  # 2026-11-28: event times must be real Unix seconds


def main() -> None:
    spec, spool_dir, job, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    fork = sys.argv[5:] == ["fork"]
    sink: EventSink | str = JsonlSink(spec[6:]) if spec.startswith("jsonl:") else spec
    # A long linger and big batches: nothing is written before exit unless asked.
    timeout = float(os.environ.get("CHILD_EMIT_TIMEOUT", "1"))
    em = Emitter(job, "att-1", sink=sink, spool_dir=spool_dir, emit_timeout=timeout,
                 linger=30.0, batch_size=100_000)
    first = n // 2 if fork else n
    for i in range(first):
        em.progress(i, i + 1, i, i + 1, start_ts=T + i, end_ts=T + i + 0.5)
    if not fork:
        return
    pid = os.fork()
    if pid == 0:
        for i in range(first, n):
            em.progress(i, i + 1, i, i + 1, start_ts=T + i, end_ts=T + i + 0.5)
        writer = em.writer
        assert writer is not None
        ok = em.flush(max(5.0, timeout))
        alive = writer._thread is not None and writer._thread.is_alive()
        print(f"child prefix={writer.ids.prefix} flushed={ok} thread={alive} "
              f"written={writer.stats.written}", flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    writer = em.writer
    assert writer is not None
    print(f"parent prefix={writer.ids.prefix} child_status={status}", flush=True)


if __name__ == "__main__":
    main()
