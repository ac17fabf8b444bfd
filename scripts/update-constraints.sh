#!/usr/bin/env bash
# Regenerate constraints.txt from a real resolution of pyproject.toml, the way Airflow
# makes its constraint files: install into a throwaway venv, then freeze what pip chose.
#
#   scripts/update-constraints.sh          (or: make constraints)
#
# It resolves afresh (the current constraints.txt is NOT used), installs torchrec in a
# second step with --no-deps (it declares the CUDA fbgemm-gpu; see
# docs/decisions/0001-dependency-pins.md), refuses a result with CUDA packages in it,
# and rewrites constraints.txt in place. Review the diff, then run `make setup`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TORCHREC_VERSION=1.8.0

say() { printf 'update-constraints: %s\n' "$*"; }
die() { printf 'update-constraints: ERROR: %s\n' "$*" >&2; exit 1; }

PY=""
for candidate in python3.11 python3; do
    if version=$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
        && [ "$version" = "3.11" ]; then
        PY="$candidate"
        break
    fi
done
[ -n "$PY" ] || die "Python 3.11 is required (tried python3.11, python3)"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ett-constraints.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
VPY="$WORK/venv/bin/python"
LOG="$WORK/pip.log"

run() {  # run a pip step quietly; show its log if it fails
    if ! "$@" >>"$LOG" 2>&1; then
        tail -n 60 "$LOG" >&2
        die "failed: $*"
    fi
}

say "throwaway venv in $WORK/venv ($("$PY" -V 2>&1))"
"$PY" -m venv "$WORK/venv"
run "$VPY" -m pip install --upgrade pip
say "resolving pyproject.toml: pip install -e \".[dev,lightning,hf]\" (about a minute)"
run "$VPY" -m pip install -e "$ROOT[dev,lightning,hf]"
say "pip install --no-deps torchrec==$TORCHREC_VERSION"
run "$VPY" -m pip install --no-deps "torchrec==$TORCHREC_VERSION"

FROZEN="$WORK/frozen.txt"
"$VPY" -m pip freeze --all --exclude-editable >"$FROZEN"

if cuda=$(grep -iE '^(nvidia[-_]|triton==|pytorch[-_]triton|fbgemm[-_]gpu==)' "$FROZEN"); then
    die "the resolution pulled in CUDA packages; not writing constraints.txt:
$cuda"
fi
grep -q "^torchrec==$TORCHREC_VERSION\$" "$FROZEN" || die "torchrec==$TORCHREC_VERSION missing from the freeze"
grep -qiE '^fbgemm[-_]gpu[-_]cpu==' "$FROZEN" || die "fbgemm-gpu-cpu missing from the freeze"

{
    echo "# airflow-ett constraints: a real resolution of pyproject.toml, frozen (like Airflow's"
    echo "# constraint files). Install with -c, never edit by hand; regenerate with"
    echo "#   scripts/update-constraints.sh     (or: make constraints)"
    echo "#"
    echo "# Produced on $(date -u '+%Y-%m-%d %H:%M:%S UTC') with $("$VPY" -V 2>&1) ($(uname -m)), $("$VPY" -m pip -V | cut -d' ' -f1-2), by:"
    echo "#   python3.11 -m venv /tmp/venv && /tmp/venv/bin/python -m pip install --upgrade pip"
    echo "#   /tmp/venv/bin/python -m pip install -e \".[dev,lightning,hf]\""
    echo "#   /tmp/venv/bin/python -m pip install --no-deps torchrec==$TORCHREC_VERSION"
    echo "#   /tmp/venv/bin/python -m pip freeze --all --exclude-editable"
    echo "# torchrec is installed with --no-deps in a second step: it declares the CUDA"
    echo "# fbgemm-gpu, which would replace fbgemm-gpu-cpu (docs/decisions/0001-dependency-pins.md)."
    echo "# torch's +cpu build comes from a local wheel directory or the PyTorch CPU index"
    echo "# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu); no CUDA package is pinned."
    cat "$FROZEN"
} >"$WORK/constraints.txt"
mv "$WORK/constraints.txt" "$ROOT/constraints.txt"
say "wrote constraints.txt ($(grep -vc '^#' "$ROOT/constraints.txt") pins); review with: git diff constraints.txt"
