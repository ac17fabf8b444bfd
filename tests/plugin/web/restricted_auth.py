"""A test auth manager: Airflow's SimpleAuthManager, except that some users may not read
some DAGs. For the real-server tests of the ETT pages (tests/e2e/test_ett_pages*.py),
loaded by the API server through `[core] auth_manager`: site.py copies this file, which
imports only Airflow, into a directory of its own on the components' PYTHONPATH.

Why a test one: SimpleAuthManager decides by role alone (a viewer reads every DAG), and
the FAB provider, which has per-DAG permissions, is not installed here. Only
`is_authorized_dag` changes; Airflow's `get_authorized_dag_ids` and
`filter_authorized_dag_ids`, which the pages use, call it per DAG, so they agree with it.
A question about no DAG in particular (`details` None or without an id: "may this user
read DAGs at all", what Airflow's DAG list asks) keeps the role's answer, as FAB answers
it for a user who may read some DAGs.

`ETT_TEST_DAG_DENY` says who may not read what: `user:dag1|dag2,other:dag3`.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

DENY_ENV = "ETT_TEST_DAG_DENY"


def denied() -> dict[str, frozenset[str]]:
    out: dict[str, frozenset[str]] = {}
    for item in filter(None, (p.strip() for p in os.environ.get(DENY_ENV, "").split(","))):
        user, _, dags = item.partition(":")
        out[user.strip()] = frozenset(d.strip() for d in dags.split("|") if d.strip())
    return out


class RestrictedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None,
                          details: Any = None) -> bool:
        dag_id = getattr(details, "id", None)
        if dag_id and dag_id in denied().get(user.get_name(), frozenset()):
            return False
        return bool(super().is_authorized_dag(method=method, user=user,
                                              access_entity=access_entity, details=details))
