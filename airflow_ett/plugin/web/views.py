"""Where the ETT pages appear in the Airflow UI: the plugin's `external_views`.

Imported by `airflow_ett.plugin` in every Airflow process, so it imports nothing beyond the
standard library at module level (Airflow's configuration is read when asked).

Airflow 3.3's UI renders an external view in an iframe (sandbox `allow-scripts
allow-same-origin allow-forms allow-downloads`, so the pages run their scripts and the
browser sends the session cookie with every request from them); for destinations other
than `nav` it replaces `{DAG_ID}`, `{RUN_ID}`, `{TASK_ID}` and `{MAP_INDEX}` in `href`,
URL-encoded, before loading it. `url_route` names the UI's own route to the view
(`/plugin/ett`, `/dags/<dag>/runs/<run>/plugin/ett_breakdown`).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import urlparse

#: Where the plugin's FastAPI app is mounted (a prefix Airflow does not reserve).
URL_PREFIX: Final = "/ett"
APP_NAME: Final = "ETT"
NAV_ROUTE: Final = "ett"
RUN_ROUTE: Final = "ett_breakdown"


def base_path(base_url: str | None = None) -> str:
    """The path Airflow is served under (`[api] base_url`'s path, no trailing slash), so the
    links work behind a proxy that serves Airflow at `/airflow`. '' at the root."""
    if base_url is None:
        try:
            from airflow.configuration import conf

            base_url = conf.get("api", "base_url", fallback="/") or "/"
        except Exception:  # no usable configuration: Airflow at the root
            base_url = "/"
    path = urlparse(base_url).path if "://" in base_url else base_url
    return "/" + path.strip("/") if path.strip("/") else ""


def external_views(base: str | None = None) -> list[dict[str, Any]]:
    """The two views: the fleet page in the navigation (top level), and the run page as a
    tab of every DAG run (a run with no ETT events says so there)."""
    root = (base_path() if base is None else base) + URL_PREFIX
    icons = {"icon": f"{root}/static/ett-icon.svg",
             "icon_dark_mode": f"{root}/static/ett-icon-dark.svg"}
    return [
        {"name": APP_NAME, "href": f"{root}/", "destination": "nav", "url_route": NAV_ROUTE,
         "nav_top_level": True, **icons},
        {"name": "ETT breakdown", "href": f"{root}/runs/{{DAG_ID}}/{{RUN_ID}}",
         "destination": "dag_run", "url_route": RUN_ROUTE, **icons},
    ]
