"""The ETT web app: what the plugin mounts at `/ett` in Airflow's API server.

`create_app()` is called once per API server process, when Airflow reads the plugin's
`fastapi_apps` (see `airflow_ett.plugin`): never in the scheduler, the dag processor, the
triggerer or a worker. Routes:

  /ett/                              the fleet page             (HTML)
  /ett/runs/{dag_id}/{run_id}        one run's ETT breakdown    (HTML; the DAG-run tab)
  /ett/api/v1/fleet?from=&to=        the fleet's figures        (JSON)
  /ett/api/v1/runs/{dag_id}/{run_id} one run's figures          (JSON)
  /ett/compare?a=D1..D2&b=D3..D4     what moved ETT% between two windows (HTML)
  /ett/api/v1/compare?a=&b=          the same                   (JSON)
  /ett/openapi.json                  FastAPI's OpenAPI schema of the JSON API
  /ett/static/{name}                 plotly.js, the pages' script, style and icons

Every one of them requires a signed-in user: `access.signed_in` (Airflow's `get_user`) is a
dependency of the app itself, and FastAPI's own schema and docs routes, which would not
carry it, are switched off and replaced by a route that does. Errors are JSON for API
clients and a small page for a browser (Accept: text/html), with the same status; a bad
parameter is one line naming it and its value (never pydantic's list of errors).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Final

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from airflow_ett import __version__
from airflow_ett.plugin.web import api, compare, pages
from airflow_ett.plugin.web.access import signed_in
from airflow_ett.report.html import (
    CHARTS_JS_NAME,
    PLOTLY_JS_NAME,
    charts_js_path,
    plotly_js_path,
)
from airflow_ett.settings import SettingsError
from airflow_ett.store import StoreError

log = logging.getLogger(__name__)

#: Scripts and styles from this app only; plotly.js sets inline styles on its SVG; the
#: pages may be framed by the Airflow UI (same origin) and nothing else.
CSP: Final = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
              "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
              "base-uri 'none'; form-action 'self'; frame-ancestors 'self'")
_YEAR: Final = "public, max-age=31536000, immutable"  # a versioned file name
_HOUR: Final = "private, max-age=3600"


def _static(name: str) -> Path:
    return Path(str(resources.files("airflow_ett.plugin.web") / "static" / name))


#: The only files `/static/` serves: name -> (path, media type, Cache-Control).
STATIC: Final[dict[str, tuple[Path, str, str]]] = {
    PLOTLY_JS_NAME: (plotly_js_path(), "text/javascript", _YEAR),
    CHARTS_JS_NAME: (charts_js_path(), "text/javascript", _HOUR),
    "ett.js": (_static("ett.js"), "text/javascript", _HOUR),
    "ett.css": (_static("ett.css"), "text/css", _HOUR),
    "ett-icon.svg": (_static("ett-icon.svg"), "image/svg+xml", _HOUR),
    "ett-icon-dark.svg": (_static("ett-icon-dark.svg"), "image/svg+xml", _HOUR),
}


def _wants_html(request: Request) -> bool:
    return ("text/html" in request.headers.get("accept", "")
            and "/api/" not in request.url.path)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def invalid_parameters(errors: Sequence[Mapping[str, Any]]) -> str:
    """FastAPI's validation errors as one line naming each parameter and its value:
    `from: 'yesterday' is not a day YYYY-MM-DD (input should be ...)`."""
    out = []
    for error in errors:
        loc = [str(x) for x in error.get("loc", ()) if x not in ("query", "path", "body")]
        name = ".".join(loc) or "request"
        why = str(error.get("msg", "invalid")).rstrip(".")
        what = " is not a day YYYY-MM-DD" if name in ("from", "to") else " is not valid"
        value = f" {_short(error['input'])}" if "input" in error else ""
        out.append(f"{name}:{value}{what} ({why[:1].lower()}{why[1:]})")
    return "; ".join(out) or "the request's parameters are not valid"


def error_response(request: Request, status: int, detail: Any,
                   headers: Mapping[str, str] | None = None) -> Response:
    if _wants_html(request):
        return pages.render_error(request, status,
                                  detail if isinstance(detail, str) else str(detail))
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _install_errors(app: FastAPI) -> None:
    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return error_response(request, exc.status_code, exc.detail, exc.headers)

    async def invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(request, 422, invalid_parameters(exc.errors()))

    async def store_error(request: Request, exc: Exception) -> Response:
        log.warning("ETT pages: the ETT store cannot be read: %s", exc)
        return error_response(request, 503, f"the ETT store cannot be read: {exc}")

    async def settings_error(request: Request, exc: Exception) -> Response:
        return error_response(request, 503, f"the [ett] configuration is wrong: {exc}")

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(SettingsError, settings_error)


def _install_routes(app: FastAPI) -> None:
    @app.get("/openapi.json", include_in_schema=False)
    def openapi(request: Request) -> dict[str, Any]:
        schema = dict(app.openapi())
        schema["servers"] = [{"url": request.scope.get("root_path", "") or "/"}]
        return schema

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        if name not in STATIC:
            raise HTTPException(status_code=404, detail=f"no static file {name!r}")
        path, media_type, cache = STATIC[name]
        return FileResponse(path, media_type=media_type, headers={"Cache-Control": cache})

    @app.middleware("http")
    async def headers(request: Request,
                      call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        response.headers.setdefault("Content-Security-Policy", CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if "Cache-Control" not in response.headers:
            response.headers["Cache-Control"] = "no-store"  # figures per user: not shared
        return response


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    store = getattr(app.state, "ett_store", None)
    if store is not None:
        store.close()


def create_app() -> FastAPI:
    app = FastAPI(
        title="airflow-ett",
        version=__version__,
        description="Effective Training Time of the fleet and of each training run, as "
                    "the pages inside the Airflow UI show it. Every route needs an Airflow "
                    "login (a bearer token from POST /auth/token, or the UI's session "
                    "cookie); figures cover only the DAGs the caller may read.",
        dependencies=[Depends(signed_in)],
        openapi_url=None, docs_url=None, redoc_url=None,
        lifespan=_lifespan,
    )
    app.include_router(api.router)
    app.include_router(compare.router)
    app.include_router(pages.router)
    _install_routes(app)
    _install_errors(app)
    return app
