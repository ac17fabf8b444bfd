#!/usr/bin/env bash
# Create or refresh the project's virtualenv, .venv, from constraints.txt. Idempotent:
# when .venv already matches constraints.txt, pyproject.toml, this script and the chosen
# interpreter (path and full version; a hash kept in .venv/.airflow-ett-setup) and its
# imports work, it does nothing.
#
#   scripts/setup.sh                               (or: make setup)
#   PYTHON=/usr/bin/python3.11 scripts/setup.sh    (or: make setup PYTHON=/usr/bin/python3.11)
#
# The interpreter: $PYTHON when set (refused, with the reason, unless it is a Python 3.11
# with the venv and ensurepip modules); otherwise the one the existing .venv was built
# with, while it still works; otherwise python3.11, then python3, from PATH. A .venv built
# with another interpreter than the chosen one is rebuilt.
#
# Steps: Python 3.11 check -> venv -> pip -> pip install -c constraints.txt -e ".[dev,lightning,hf]"
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

# "<real executable> <x.y.z>" of an interpreter, or nothing when it does not run.
py_ident() {
    "$1" -c 'import os, platform, sys; print(os.path.realpath(sys.executable), platform.python_version())' 2>/dev/null
}

# Why an interpreter cannot build the venv (empty when it can). Debian and Ubuntu ship
# venv's ensurepip in a separate package, without which `python3.11 -m venv` fails.
py_unfit() {
    local cmd="$1" version error
    if ! version="$(py_version "$cmd")"; then
        error="$("$cmd" -c 'pass' 2>&1 | head -n 1 || true)"
        echo "it does not run${error:+ ($error)}"
        return
    fi
    if [ "$version" != "3.11" ]; then
        echo "it is Python $version; airflow-ett needs Python 3.11 (e.g. apt-get install python3.11 python3.11-venv)"
        return
    fi
    if ! "$cmd" -c 'import venv, ensurepip' 2>/dev/null; then
        echo "it lacks the venv/ensurepip modules (on Debian/Ubuntu: apt-get install python3.11-venv)"
    fi
}

# The interpreter the existing .venv was built with (pyvenv.cfg), when it still exists.
venv_base() {
    [ -f "$VENV/pyvenv.cfg" ] || return 0
    sed -n 's/^executable *= *//p' "$VENV/pyvenv.cfg" | head -n 1
}

# 1. The interpreter: PYTHON, else the existing .venv's, else python3.11 / python3 on PATH.
PY=""
if [ -n "${PYTHON:-}" ]; then
    resolved="$(command -v -- "$PYTHON" 2>/dev/null || true)"
    [ -n "$resolved" ] || die "PYTHON=$PYTHON: no such interpreter (install Python 3.11 with its venv module, e.g. apt-get install python3.11 python3.11-venv, or unset PYTHON to search PATH)"
    why="$(py_unfit "$resolved")"
    [ -z "$why" ] || die "PYTHON=$PYTHON ($resolved) refused: $why"
    PY="$resolved"
else
    found=""
    base="$(venv_base)"
    for candidate in ${base:+"$base"} python3.11 python3; do
        resolved="$(command -v -- "$candidate" 2>/dev/null || true)"
        [ -n "$resolved" ] || continue
        why="$(py_unfit "$resolved")"
        if [ -z "$why" ]; then PY="$resolved"; break; fi
        found="${found:+$found; }$candidate ($resolved): $why"
    done
    [ -n "$PY" ] || die "airflow-ett needs Python 3.11 with venv (python3.11 or python3 on PATH, or PYTHON=/path/to/python3.11); found: ${found:-none}"
fi
ident="$(py_ident "$PY")" || die "$PY does not run"
PY="${ident% *}"
say "using $PY (Python ${ident##* })"

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

want="$({ cat constraints.txt pyproject.toml scripts/setup.sh; echo "python: $ident"; } | "$PY" -c \
    'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"

# 2. Nothing to do?
if [ -x "$VPY" ] && [ "$(py_version "$VPY")" = "3.11" ] && [ -f "$STAMP" ] \
    && [ "$(cat "$STAMP")" = "$want" ] && check_imports 2>/dev/null; then
    say ".venv is up to date (constraints.txt, pyproject.toml unchanged; imports ok)"
    exit 0
fi

# 3. The venv itself: reuse a working one of the chosen interpreter, replace anything else.
if [ -e "$VENV" ]; then
    have="$(py_ident "$VPY" || true)"
    built_with="$(venv_base)"
    if [ -z "$have" ] || [ "$(py_version "$VPY" || true)" != "3.11" ]; then
        say "existing .venv is broken or not Python 3.11: recreating it"
        rm -rf "$VENV"
    elif [ "${have##* }" != "${ident##* }" ] \
        || [ "$(realpath -m -- "${built_with:-?}")" != "$PY" ]; then
        say "existing .venv was built with ${built_with:-an unknown interpreter} (Python ${have##* }): rebuilding it with $PY"
        rm -rf "$VENV"
    fi
fi
if [ ! -x "$VPY" ]; then
    say "creating .venv with $PY"
    "$PY" -m venv "$VENV" \
        || die "$PY -m venv failed (on Debian/Ubuntu the venv module needs: apt-get install python3.11-venv)"
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
pip_step -c constraints.txt -e ".[dev,lightning,hf]"
pip_step -c constraints.txt --no-deps "torchrec==$TORCHREC_VERSION"

# 5. Verify, then stamp.
say "checking: import torch, torchrec, airflow_ett"
check_imports || die "the new .venv does not import torch, torchrec and airflow_ett (log: $LOG)"
printf '%s\n' "$want" >"$STAMP"
say "done: $("$VPY" -c 'from importlib.metadata import version as v; print("torch", v("torch"), "| torchrec", v("torchrec"), "| apache-airflow", v("apache-airflow"))') in .venv"
