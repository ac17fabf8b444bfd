"""What the browser tests share: Debian's chromium (no browser download here), the flags it
needs on a closed network, and where screenshots go.

`scripts/test.sh` installs the `chromium` package when it is missing (as root, with
apt-get); without it the browser tests skip with the install command as the reason, which
CI (ETT_REQUIRE_SERVICES=1) counts as a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
# ../shared/TESTING.md "Browser tests": without the background-networking flags the
# browser's own connections (refused on a closed network) fill the log.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def artifacts_dir(name: str) -> Path:
    """`$ETT_TEST_ARTIFACTS/<name>/`, default `tests/artifacts/<name>/` (git-ignored)."""
    base = os.environ.get("ETT_TEST_ARTIFACTS")
    out = (Path(base) if base else ROOT / "tests" / "artifacts") / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def chromium() -> str:
    found = str(CHROMIUM) if CHROMIUM.is_file() else shutil.which("chromium")
    if not found:
        pytest.skip("no Chromium: the browser tests need Debian's chromium package "
                    "(apt-get install -y chromium; scripts/test.sh installs it as root)")
    return found
