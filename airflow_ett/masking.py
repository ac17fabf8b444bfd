"""Credentials out of anything shown: URLs, DSNs and free text quoting them.

One masker for every error and log line that shows a store URL (the store's errors, the
CLI, the emitter and its spool, the listeners), so a secret cannot leak through the one
place that formatted a URL its own way. Pure stdlib, no SQLAlchemy: the emitter's sink
and the listeners import it in every Airflow process, and the URLs it must handle are
often exactly the ones SQLAlchemy's parser refuses.
"""

from __future__ import annotations

import re
from typing import Final

_SCHEME: Final = re.compile(r"^.*?://", re.S)  # whatever stands before, scheme or not
# What may follow the '@' that ends a URL's userinfo: a host (or [IPv6]) and a port.
_HOST: Final = r"(?:\[[^\]/?#@\s]*\]|[^\s/?#@:\[\]]*)(?::[^\s/?#@]*)?"
_HOST_THEN_PATH: Final = re.compile(_HOST + r"(?=/)")
_HOST_THEN_END: Final = re.compile(_HOST + r"(?=[?#]|$)")
# key=value pairs whose key names a credential: in a URL's query (?a=1&password=x), in a
# libpq DSN (host=h password=x) and in driver messages quoting either. The value runs to
# the next `&key=` / `;key=` / whitespace, so a password holding '&' still ends masked.
_SECRET_PARAM: Final = re.compile(
    r"(?i)(?P<key>(?:^|(?<=[?&;\s,(]))[\w.\-]*(?:pass|pwd|secret|token|api[_\-]?key"
    r"|credential|auth|private[_\-]?key)[\w.\-]*\s*=\s*)"
    r"(?P<value>'[^']*'?|\"[^\"]*\"?|.*?(?=[&;][\w.\-]+=|[\s#]|$))"
)
_URL_IN_TEXT: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://\S+")
MASK: Final = "***"


def _userinfo_end(rest: str) -> int | None:
    """Where the userinfo of `rest` (a URL after its `scheme://`) ends: its last '@'.

    A password may hold '@', ':', '/' or '?' unencoded (people paste them so), so the
    first '@' is not the end: the last one that a host and a path follow is; then the
    last one a host and the end (or a query) follow; then, failing both, the last '@' at
    all, which over-masks rather than leaks.
    """
    ats = [i for i, ch in enumerate(rest) if ch == "@"]
    for pattern in (_HOST_THEN_PATH, _HOST_THEN_END):
        for at in reversed(ats):
            if pattern.match(rest, at + 1):
                return at
    return ats[-1] if ats else None


def _mask_params(text: str) -> str:
    return _SECRET_PARAM.sub(lambda m: m.group("key") + MASK, text)


def _mask(text: str) -> str:
    scheme = _SCHEME.match(text)
    if scheme is None:
        # No `scheme://` (a mistyped URL, a bare `user:pw@host/db`): each word that has a
        # userinfo shape is masked like one.
        return _mask_params(" ".join(_mask(f"://{word}")[3:] if "@" in word else word
                                     for word in text.split(" ")))
    head, rest = text[:scheme.end()], text[scheme.end():]
    at = _userinfo_end(rest)
    if at is None:
        return head + _mask_params(rest)
    user, colon, _password = rest[:at].partition(":")
    userinfo = f"{user}:{MASK}" if colon else user
    return f"{head}{userinfo}@{_mask_params(rest[at + 1:])}"


def mask_url(url: object) -> str:
    """The URL as it may be shown: `***` for the password and for credential parameters.

    Masks the userinfo password (holding '@', ':' or percent-escapes included) and query
    parameters such as `password`, `sslpassword`, `token`, `api_key`. Written without
    SQLAlchemy's parser, and never raising, because the URLs that end up in error
    messages are exactly the ones a parser refuses; on any surprise it shows nothing.
    """
    try:
        return _mask(str(url))
    except Exception:  # a hostile __str__, a regex surprise: never leak, never raise
        return MASK


def mask_text(text: object) -> str:
    """Free text (a driver's message, a log line) with every URL and DSN secret masked."""
    try:
        masked = _URL_IN_TEXT.sub(lambda m: mask_url(m.group(0)), str(text))
        return _mask_params(masked)
    except Exception:
        return MASK
