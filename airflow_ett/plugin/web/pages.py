"""The HTML pages: the fleet (`/ett/`) and one run (`/ett/runs/<dag_id>/<run_id>`).

Rendered on the server from the API's models (`data.py`), so a table shows the number the
JSON API returns, with the report's formatting (`airflow_ett.report.formatting`); the
charts are the report's plotly figure specs, drawn in the browser by the bundled plotly.js
(`/ett/static/`, nothing from the internet) and `static/ett.js`, which follows the Airflow
UI's light or dark theme (see there). Tables and numbers need no JavaScript.

Escaping: Jinja2 autoescape for every value (tenant, job and phase names come from users);
the figure JSON sits in `<script type="application/json">` with `<`, `>`, `&` escaped, and
the figure builders escape user strings for plotly.js's own markup. The pages run no
inline script, so the Content-Security-Policy (`app.py`) allows scripts from /ett/ only.
"""

from __future__ import annotations

import copy
import datetime as dt
import functools
import json
from importlib import resources
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

import jinja2
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from airflow_ett.plugin.web import data, views
from airflow_ett.plugin.web.access import DagScopeDep, fleet_access, run_access
from airflow_ett.plugin.web.api import FromQuery, JobQuery, ToQuery, days_or_422, run_or_404
from airflow_ett.plugin.web.deps import NowDep, StoreDep, TodayDep
from airflow_ett.report import formatting as fmt
from airflow_ett.report import html as report

router = APIRouter(include_in_schema=False)

#: How often a running job's page fetches itself again (static/ett.js): its figures move
#: with the clock, and a new attempt or failure shows within this long.
REFRESH_S: Final = 10


def script_json(value: object) -> Markup:
    """JSON for a `<script type="application/json">`: no string in it can end the element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return Markup(text)  # escaped just above: nothing in it is markup


def _utc(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _window(minutes: int) -> str:
    """A rolling window's name: `5 min`, `90 min`, `1 h`, `24 h`."""
    return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"


def _nof(nof: dict[str, int]) -> str:
    """`3 (infra 2, preemption 1)`: the total, then each cause that happened."""
    causes = ", ".join(f"{k} {v}" for k, v in nof.items() if k != "total" and v)
    return f"{nof.get('total', 0)}" + (f" ({causes})" if causes else "")


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("airflow_ett.plugin.web", "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True)
    env.filters.update(pct=fmt.fmt_pct, delta=fmt.fmt_delta, gpu_h=fmt.fmt_gpu_h,
                       dur=fmt.fmt_duration, step=fmt.fmt_step, utc=_utc, nof=_nof,
                       window=_window,
                       slow=lambda g: fmt.fmt_slow_steps(g.gpu_hours_lost_to_slow_steps,
                                                         g.slow_steps_pct_of_effective),
                       q=lambda v: quote(str(v), safe=""),
                       rate=lambda v: "-" if v is None else f"{v:.3f}")
    env.globals.update(colours=report.COMPONENT_COLOURS, cause_colours=report.CAUSE_COLOURS)
    return env


def page_context(request: Request) -> dict[str, Any]:
    """What every page needs: where it lives, where Airflow's UI is, the chart themes."""
    root = str(request.url_for("fleet_page").path).rstrip("/")
    return {"root": root, "airflow": views.base_path(), "plotly_js": report.PLOTLY_JS_NAME,
            "charts_js": report.CHARTS_JS_NAME,
            "themes_json": script_json(report.THEMES),
            "config_json": script_json(report.PLOTLY_CONFIG)}


def render(request: Request, template: str, status_code: int = 200,
           **context: Any) -> HTMLResponse:
    body = environment().get_template(template).render(**page_context(request), **context)
    return HTMLResponse(body, status_code=status_code)


@functools.cache
def _stylesheet() -> Markup:
    """`static/ett.css`, for a page that cannot load it (a user not signed in: every
    route, `/static/` too, needs a login). The CSP allows inline styles (plotly's own)."""
    path = resources.files("airflow_ett.plugin.web") / "static" / "ett.css"
    return Markup(path.read_text(encoding="utf-8").replace("</", "<\\/"))


def _same_origin_path(url: str, request: Request) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or parts.netloc != request.headers.get("host"):
        return None
    return parts.path + (f"?{parts.query}" if parts.query else "")


def came_from(request: Request) -> str:
    """Where a sign-in should bring the user back to, as a path on this site: the Airflow
    UI's page when this one is its iframe (the browser says `Sec-Fetch-Dest: iframe`, and
    the UI's page is the referrer), else this page itself, as the browser asked for it
    (the raw path: a run id's `%2F` stays one)."""
    referrer = request.headers.get("referer")
    if request.headers.get("sec-fetch-dest") == "iframe" and referrer:
        framed = _same_origin_path(referrer, request)
        if framed is not None:
            return framed
    raw = request.scope.get("raw_path")
    path = raw.decode("latin-1") if isinstance(raw, bytes) else quote(request.url.path)
    query = request.url.query
    return path + (f"?{query}" if query else "")


def sign_in_url(request: Request) -> str:
    """Airflow's own login, coming back to `came_from`: `/api/v2/auth/login?next=...`,
    the route Airflow 3's UI sends a signed-out user to; it hands `next` to the configured
    auth manager's login page and refuses one that is not on this site."""
    return f"{views.base_path()}/api/v2/auth/login?{urlencode({'next': came_from(request)})}"


def render_error(request: Request, status: int, detail: str) -> HTMLResponse:
    """The error page. Not signed in (401), the page links nothing it would need a login
    for: its style is inline, it runs no script, and it links to Airflow's sign-in."""
    if status == 401:
        return render(request, "error.html.j2", status_code=status, status=status,
                      detail=detail, inline_css=_stylesheet(),
                      sign_in=sign_in_url(request))
    return render(request, "error.html.j2", status_code=status, status=status, detail=detail)


@router.get("/", name="fleet_page", dependencies=[Depends(fleet_access)])
def fleet_page(request: Request, store: StoreDep, scope: DagScopeDep, today: TodayDep,
               first: FromQuery = None, last: ToQuery = None) -> HTMLResponse:
    lo, hi = days_or_422(first, last, today)
    fleet = data.fleet(store, lo, hi, scope, figures=True)
    tenants = sorted(fleet.latest.tenants.items(), key=lambda kv: (-kv[1].gpu_hours_lost, kv[0])
                     ) if fleet.latest is not None else []
    return render(request, "fleet.html.j2", fleet=fleet, tenants=tenants,
                  figures_json=script_json(fleet.figures or {}),
                  chart_titles={k: v["layout"].get("title", {}).get("text", k)
                                for k, v in (fleet.figures or {}).items()})


@router.get("/runs/{dag_id}/{run_id:path}", name="run_page", dependencies=[Depends(run_access)])
def run_page(request: Request, dag_id: str, run_id: str, store: StoreDep,
             now: NowDep, job: JobQuery = None) -> HTMLResponse:
    found = run_or_404(store, dag_id, run_id, now, figures=True, job=job)
    figures = copy.deepcopy(found.figures or {})
    for spec in figures.values():
        # The page's header names the run: the report's long chart title would be cut off
        # in the UI's narrower iframe.
        layout = spec.get("layout", {})
        layout.get("title", {})["text"] = ""
        layout.setdefault("margin", {})["t"] = 40  # room for the legend above the plot
    return render(request, "run.html.j2", run=found, figures_json=script_json(figures),
                  refresh_s=REFRESH_S)
