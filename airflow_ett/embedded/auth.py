"""Logging in to an embedded Airflow: the SimpleAuthManager's generated admin password."""

from __future__ import annotations

from pathlib import Path

from airflow_ett._untrusted import UntrustedFileError, load_json

ADMIN_USER = "admin"
PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"


def admin_password(home: Path) -> str | None:
    """The SimpleAuthManager's generated password for `admin`, or None before it exists.

    The api-server writes the file on its first start; a later start reuses it.
    """
    path = home / PASSWORD_FILE
    try:  # Airflow's own file, still read bounded (a few users: a few hundred bytes)
        passwords = load_json(path, what="password file", max_bytes=1 << 20)
    except UntrustedFileError:
        return None
    value = passwords.get(ADMIN_USER) if isinstance(passwords, dict) else None
    return str(value) if value else None


def login_info(home: Path, url: str) -> str:
    """Where to log in to the UI, as lines a person can read in a terminal."""
    password = admin_password(home)
    return "\n".join([
        f"Airflow UI: {url}",
        f"  user:     {ADMIN_USER}",
        f"  password: {password if password else '(not generated yet: start the api-server)'}"
        f"  (from {home / PASSWORD_FILE})",
    ])
