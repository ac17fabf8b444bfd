"""What the routes share besides access: the ETT store, the clock, the rollup's time zone.

Dependencies, so that tests replace them (`app.dependency_overrides`) with a store in a
temporary directory and a fixed clock. The store is the one `[ett] store_url` names,
opened once per app on the first request that needs it (opening connects to nothing), so
an API server whose store is down still starts and its pages say what is wrong (503).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Annotated

from fastapi import Depends, Request

from airflow_ett.store import EttStore

_lock = threading.Lock()


def get_store(request: Request) -> EttStore:
    state = request.app.state
    store: EttStore | None = getattr(state, "ett_store", None)
    if store is None:
        with _lock:
            store = getattr(state, "ett_store", None)
            if store is None:
                store = state.ett_store = EttStore()
    return store


def now() -> float:
    return time.time()


def today() -> dt.date:
    """Today in the rollup's time zone (`[ett] rollup_timezone`): the default last day."""
    from airflow_ett.rollup import day_of
    from airflow_ett.settings import RollupSettings

    return day_of(time.time(), RollupSettings.load().timezone)


StoreDep = Annotated[EttStore, Depends(get_store)]
NowDep = Annotated[float, Depends(now)]
TodayDep = Annotated[dt.date, Depends(today)]
