#!/usr/bin/env bash
# Create or refresh the project's virtualenv, .venv, from constraints.txt. Idempotent:
# when .venv already matches constraints.txt, pyproject.toml and this script (a hash kept
# in .venv/.airflow-ett-setup) and its imports work, it does nothing.
#
#   scripts/setup.sh        (or: make setup)
#
# Steps: Python 3.11 check -> venv -> pip -> pip install -c constraints.txt -e ".[dev]"
# -> pip install -c constraints.txt --no-deps torchrec (it declares the CUDA fbgemm-gpu;
# docs/decisions/0001-dependency-pins.md) -> import check -> stamp.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.airflow-ett-setup"
LOG="$VENV/setup.log"
TORCHREC_VERSION=1.8.0

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: ERROR: %s\n' "$*" >&2; exit 1; }

py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

# 1. Python 3.11 (python3.11 if present, else python3).
PY=""
found=""
for candidate in python3.11 python3; do
    command -v "$candidate" >/dev/null 2>&1 || continue
    version="$(py_version "$candidate")" || continue
    if [ "$version" = "3.11" ]; then PY="$candidate"; break; fi
    found="${found:+$found, }$candidate is $version"
done
[ -n "$PY" ] || die "airflow-ett needs Python 3.11 (python3.11 or python3 on PATH); found: ${found:-none}"

[ -f constraints.txt ] || die "constraints.txt is missing (regenerate it with scripts/update-constraints.sh)"

# The imports that make a usable .venv; run outside the repo (-P) so that the checkout
# itself on sys.path cannot stand in for the editable install.
check_imports() {
    "$VPY" -P - "$ROOT" <<'PY'
import sys
from importlib import metadata
from pathlib import Path

import airflow_ett
import torch  # noqa: F401
import torchrec  # noqa: F401

root = Path(sys.argv[1]).resolve()
if not Path(airflow_ett.__file__).resolve().is_relative_to(root):
    sys.exit(f"airflow_ett is imported from {airflow_ett.__file__}, not from {root}")
cuda = sorted(
    name
    for dist in metadata.distributions()
    if (name := (dist.metadata["Name"] or "").lower().replace("_", "-")).startswith("nvidia-")
    or name in ("triton", "pytorch-triton", "fbgemm-gpu")
)
if cuda:
    sys.exit(f"CUDA packages in .venv (the CPU build needs none): {', '.join(cuda)}")
PY
}

want="$(cat constraints.txt pyproject.toml scripts/setup.sh | "$PY" -c \
    'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"

# 2. Nothing to do?
if [ -x "$VPY" ] && [ "$(py_version "$VPY")" = "3.11" ] && [ -f "$STAMP" ] \
    && [ "$(cat "$STAMP")" = "$want" ] && check_imports 2>/dev/null; then
    say ".venv is up to date (constraints.txt, pyproject.toml unchanged; imports ok)"
    exit 0
fi

# 3. The venv itself: reuse a working 3.11 one, replace anything else.
if [ -e "$VENV" ] && { [ ! -x "$VPY" ] || [ "$(py_version "$VPY" || true)" != "3.11" ]; }; then
    say "existing .venv is broken or not Python 3.11: recreating it"
    rm -rf "$VENV"
fi
if [ ! -x "$VPY" ]; then
    say "creating .venv with $PY ($("$PY" -V 2>&1))"
    "$PY" -m venv "$VENV"
else
    say "updating the existing .venv"
fi
rm -f "$STAMP"
: >"$LOG"

pip_step() {  # quiet pip step; its output goes to .venv/setup.log, shown on failure
    say "pip install $*"
    if ! "$VPY" -m pip install --disable-pip-version-check "$@" >>"$LOG" 2>&1; then
        tail -n 60 "$LOG" >&2
        if grep -q 'torch==.*+cpu' "$LOG"; then
            say "hint: the CPU build of torch comes from a local wheel directory or the PyTorch" >&2
            say "      CPU index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup" >&2
        fi
        die "pip install $* failed (full log: $LOG)"
    fi
}

# 4. Packages, pinned by constraints.txt.
pip_step -c constraints.txt --upgrade pip setuptools
pip_step -c constraints.txt -e ".[dev]"
pip_step -c constraints.txt --no-deps "torchrec==$TORCHREC_VERSION"

# 5. Verify, then stamp.
say "checking: import torch, torchrec, airflow_ett"
check_imports || die "the new .venv does not import torch, torchrec and airflow_ett (log: $LOG)"
printf '%s\n' "$want" >"$STAMP"
say "done: $("$VPY" -c 'from importlib.metadata import version as v; print("torch", v("torch"), "| torchrec", v("torchrec"), "| apache-airflow", v("apache-airflow"))') in .venv"
