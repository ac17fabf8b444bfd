"""A small client of Airflow's REST API, logged in as `admin`.

urllib, not the `airflow` CLI: one HTTP call is milliseconds, each `airflow` CLI call pays
~3-5 s of imports. Not Airflow's own client either: nothing here imports Airflow.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from airflow_ett.embedded.auth import ADMIN_USER, PASSWORD_FILE, admin_password
from airflow_ett.embedded.errors import EmbeddedAirflowError

#: How many times a GET that timed out is sent (10 s each).
READ_TRIES = 3


class RestClient:
    """The REST API at `base_url`, with the admin password the api-server wrote in `home`.

    The bearer token is fetched on first use and again when the API answers 401 (it
    expired, or the api-server restarted with a new key).
    """

    def __init__(self, base_url: str, home: Path) -> None:
        self.base_url = base_url
        self.home = home
        self._token: str | None = None

    def http(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        """One request; the status and the body (parsed JSON, else text), errors included."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", errors="replace")

    def login(self) -> None:
        """Get a fresh token now (raises while the api-server has written no password)."""
        password = admin_password(self.home)
        if password is None:
            raise EmbeddedAirflowError(f"no admin password in {self.home / PASSWORD_FILE} yet "
                                       "(has the api-server started?)")
        status, body = self.http("POST", "/auth/token",
                                 {"username": ADMIN_USER, "password": password})
        if status not in (200, 201) or not isinstance(body, dict) or "access_token" not in body:
            raise EmbeddedAirflowError(f"POST /auth/token answered {status}: {body}")
        self._token = str(body["access_token"])

    def forget_token(self) -> None:
        self._token = None

    def call(self, method: str, path: str, body: Any = None,
             expect: Iterable[int] = (200,)) -> Any:
        """Call the REST API as `admin` (`path` like `/api/v2/dags`); other statuses raise."""
        if self._token is None:
            self.login()
        status, answer = self._send(method, path, body)
        if status == 401:  # expired, or the api-server restarted with a new key
            self.login()
            status, answer = self._send(method, path, body)
        if status not in set(expect):
            raise EmbeddedAirflowError(f"{method} {path} answered {status}: {answer}")
        return answer

    def _send(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """A read that times out is asked again (a busy api-server, two cores shared with
        a Celery cluster's tasks, can take longer than one timeout): it changes nothing.
        A write is sent once: repeated, it could act twice."""
        tries = READ_TRIES if method == "GET" else 1
        for left in range(tries - 1, -1, -1):
            try:
                return self.http(method, path, body, token=self._token)
            except TimeoutError:
                if not left:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def execution_api_answers(self) -> bool:
        """Whether GET /execution/health answers 200 (no login needed)."""
        try:
            status, _ = self.http("GET", "/execution/health", timeout=5.0)
        except (OSError, urllib.error.URLError):
            return False
        return status == 200

    def health(self) -> dict[str, Any] | None:
        """GET /api/v2/monitor/health (no login needed), or None while nothing answers."""
        try:
            status, body = self.http("GET", "/api/v2/monitor/health", timeout=5.0)
        except (OSError, urllib.error.URLError):
            return None
        return body if status == 200 and isinstance(body, dict) else None
