#!/usr/bin/env bash
# The whole check, as CI runs it: ruff, mypy, then every pytest tier (unit, integration
# with PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379, slow). Expects .venv
# (make test runs scripts/setup.sh first). Extra arguments go to pytest:
#
#   scripts/test.sh                 (or: make test)
#   scripts/test.sh -m "not slow" tests/ett
#   ETT_TEST_WORKERS=0 scripts/test.sh tests/e2e    (one process, one test at a time)
#
# PostgreSQL and Redis are started here only if they are not already answering; where
# their tools are absent nothing is started and the tests that need them fail (with
# ETT_REQUIRE_SERVICES=1, set below, an integration test that skips counts as failed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

say() { printf 'test: %s\n' "$*"; }
die() { printf 'test: ERROR: %s\n' "$*" >&2; exit 1; }

[ -x .venv/bin/python ] || die ".venv is missing: run \`make setup\` (or use \`make test\`)"
export PATH="$ROOT/.venv/bin:$PATH"
export ETT_REQUIRE_SERVICES=1

wait_for() {  # wait_for SECONDS CMD...: poll until CMD succeeds
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.5
    done
}

start_postgres() {
    command -v pg_isready >/dev/null 2>&1 || return 0
    pg_isready -q -h 127.0.0.1 -p 5432 && return 0
    command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ] || return 0
    local version
    version="$(ls /etc/postgresql | sort -V | tail -n 1)"
    [ -n "$version" ] || return 0
    say "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start \
        || say "warning: PostgreSQL did not start; its tests will fail"
    wait_for 30 pg_isready -q -h 127.0.0.1 -p 5432 \
        || say "warning: PostgreSQL is not answering on 127.0.0.1:5432"
}

start_redis() {
    command -v redis-cli >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1 || return 0
    [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ] && return 0
    say "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log \
        || say "warning: Redis did not start; its tests will fail"
    wait_for 15 sh -c '[ "$(redis-cli -h 127.0.0.1 -p 6379 ping)" = PONG ]' \
        || say "warning: Redis is not answering on 127.0.0.1:6379"
}

# The browser tests (reports and the UI pages) drive Debian's chromium through Playwright;
# a new machine lacks it, so install it when we can (root with apt-get). Elsewhere the
# browser tests fail with the install command as their reason.
ensure_chromium() {
    [ -x /usr/bin/chromium ] && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing chromium (apt-get) for the browser tests"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
            || say "chromium could not be installed: the browser tests will fail"
    else
        say "no /usr/bin/chromium (apt-get install chromium): the browser tests will fail"
    fi
}

# The compose-file tests (tests/docker) validate docker/compose.yaml with a real compose
# implementation, Debian's docker-compose (no container engine needed); install it when we
# can, as for chromium. Elsewhere those tests fail with the install command as their reason.
ensure_docker_compose() {
    command -v docker-compose >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing docker-compose (apt-get) for the compose-file tests"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
            && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null \
            || say "docker-compose could not be installed: the compose tests will fail"
    else
        say "no docker-compose (apt-get install docker-compose): the compose tests will fail"
    fi
}

failed=()

say "ruff check ."
ruff check . || failed+=("ruff check")

say "mypy -p airflow_ett"
mypy -p airflow_ett || failed+=("mypy")

start_postgres
start_redis
ensure_chromium
ensure_docker_compose

# Three pytest workers, a whole test file each at a time (`loadfile`: a module's services,
# started once by its fixtures, stay in one worker). The real-service tiers wait on
# processes (sleeping steps, heartbeats, polls) more than they compute: on 2 cores one
# worker kept them about half busy (39 min, 2026-12-02), two 21 min, three 16.5 min with
# the cores 96% busy (2026-12-04), and 10.8 min once each test process kept to one torch
# thread (tests/conftest.py). ETT_TEST_WORKERS=0 runs everything in this process.
# --no-loadscope-reorder keeps the collection order (tests/conftest.py: files with slow
# tests first); xdist's default would start the files with the most tests first, which
# left the long real-service files, a few tests each, to run last and alone.
workers="${ETT_TEST_WORKERS:-3}"
say "pytest -n $workers --dist loadfile --no-loadscope-reorder $*"
rc=0
pytest -n "$workers" --dist loadfile --no-loadscope-reorder "$@" || rc=$?
case "$rc" in
    0) ;;
    5) say "pytest collected no tests: that is a failure here"; failed+=("pytest (no tests collected)") ;;
    *) failed+=("pytest (exit $rc)") ;;
esac

if [ "${#failed[@]}" -gt 0 ]; then
    summary="$(printf '%s, ' "${failed[@]}")"
    die "failed: ${summary%, }"
fi
say "all checks passed"
