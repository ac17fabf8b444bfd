"""`migrate(af)`: an `EmbeddedAirflow`'s metadata DB as `airflow db migrate` makes it,
copied from one migrated once per test process (a migrate is ~4 CPU-s of imports, and
the suite starts about a dozen Airflows; tests/embedded runs the real one).

The copy is exact only where the migrated DB does not depend on the installation's
settings. What migrate writes besides the schema is the default pool (its slot count)
and the log filename templates, both from settings; an Airflow whose environment sets
either, or whose DB is not the home's SQLite file, is migrated for real. The ETT store is
upgraded by its own command, as `EmbeddedAirflow.migrate` does.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path

from airflow_ett.embedded import EmbeddedAirflow

#: Settings that `airflow db migrate` writes into the DB (slot_pool, log_template rows).
_WRITTEN_BY_MIGRATE = (
    "AIRFLOW__CORE__DEFAULT_POOL_TASK_SLOT_COUNT",
    "AIRFLOW__LOGGING__LOG_FILENAME_TEMPLATE",
    "AIRFLOW__ELASTICSEARCH__LOG_ID_TEMPLATE",
)

_lock = threading.Lock()
_template: Path | None = None


def _migrated_template() -> Path:
    global _template
    with _lock:
        if _template is None:
            root = Path(tempfile.mkdtemp(prefix="ett-tests-airflow-db-"))
            atexit.register(shutil.rmtree, root, True)
            (root / "dags").mkdir()
            template = EmbeddedAirflow(root / "home", root / "dags")
            template.migrate()
            _template = template.home / "airflow.db"
        return _template


def migrate(af: EmbeddedAirflow, *, ett_store: bool = True) -> None:
    """What `af.migrate(ett_store=ett_store)` does, with the Airflow DB copied from a
    migrated template where that gives the same DB (the module docstring says when)."""
    own_sqlite = f"sqlite:///{af.home / 'airflow.db'}"
    if (af.env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") != own_sqlite
            or any(name in af.env for name in _WRITTEN_BY_MIGRATE)
            or (af.home / "airflow.db").exists()):
        af.migrate(ett_store=ett_store)
        return
    af.home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_migrated_template(), af.home / "airflow.db")
    if ett_store:
        af.upgrade_ett_store()
