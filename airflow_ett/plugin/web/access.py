"""Who may see what: Airflow's own FastAPI security dependencies and auth manager.

Airflow mounts a plugin's FastAPI app without authenticating anything, so the app adds
`signed_in` to every route (`app.py` puts it on the app itself, so no route can be added
without it): Airflow's `get_user`, which takes the bearer token of an API client or the
`_token` cookie the UI's login set, and answers 401 without one.

- The fleet (`fleet_access` + `dag_scope`): Airflow's `requires_access_dag("GET")`, what its
  own DAG list requires (403 for a user who may read no DAG at all), then the DAGs the auth
  manager lets the user read (`get_authorized_dag_ids`): the figures are computed over
  those. A user counts as reading every DAG when the auth manager lets them read DAGs and
  every DAG Airflow knows is among theirs; only then are the stored fleet rows (which also
  hold jobs of no known DAG) shown as they are.
- A run (`run_access`): Airflow's `requires_access_dag("GET", DagAccessEntity.RUN)` on the
  `dag_id` in the path, what its own DAG-run routes require (403 otherwise).

The auth manager is Airflow's configured one (`[core] auth_manager`): SimpleAuthManager,
FAB, Keycloak... This module decides nothing about roles itself.
"""

from __future__ import annotations

from typing import Annotated

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, get_user, requires_access_dag
from airflow.models.dag import DagModel
from fastapi import Depends
from sqlalchemy import select

from airflow_ett.plugin.web.data import DagScope

#: Every route: a signed-in user, or 401.
signed_in = get_user
#: The fleet: may read DAGs (Airflow's DAG-list rule), or 403.
fleet_access = requires_access_dag("GET")
#: A run page: may read the runs of the path's `dag_id`, or 403.
run_access = requires_access_dag("GET", DagAccessEntity.RUN)


def dag_scope(user: GetUserDep, session: SessionDep) -> DagScope:
    """The DAGs `user` may read, as the auth manager says."""
    manager = get_auth_manager()
    readable = manager.get_authorized_dag_ids(user=user, method="GET", session=session)
    known = set(session.scalars(select(DagModel.dag_id)))
    every = manager.is_authorized_dag(method="GET", user=user) and known <= readable
    return DagScope(all_dags=every, dag_ids=frozenset(readable))


DagScopeDep = Annotated[DagScope, Depends(dag_scope)]
