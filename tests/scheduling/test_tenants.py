"""The tenants file: validation (every error names file, tenant, field and value),
defaults, the bundled example, and the last-good-version cache the cluster policies read
through (re-read only on change, a broken edit never replacing a good version, threads)."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_ett import provider
from airflow_ett.scheduling import limits, tenants
from airflow_ett.scheduling.limits import Range
from airflow_ett.scheduling.model import DEFAULT_WAIT_PRICE, TenantPolicy
from airflow_ett.scheduling.tenants import (
    RACY_S,
    TenantsCache,
    TenantsConfig,
    TenantsError,
    UnknownTenantError,
    load_tenants,
    tenants_file_from_settings,
)
from tests.hostile import HOSTILE_TOML, in_thread

EXAMPLE = Path(str(resources.files("airflow_ett.scheduling") / "tenants.example.toml"))
GOOD = "[tenants.ads]\npriority = 10\nquota_gpus = 4\n"
_WRITES = itertools.count(1)


def write(path: Path, text: str, *, age_s: float | None = 60.0) -> Path:
    """Write `text` to `path`; with `age_s`, date its mtime that far in the past, so that the
    cache trusts its signature (a file modified just now is re-read: see `RACY_S`). Each
    call dates it a little differently, so every write changes the signature."""
    path.write_text(text, encoding="utf-8")
    if age_s is not None:
        ns = time.time_ns() - int(age_s * 1e9) - next(_WRITES) * 1000
        os.utime(path, ns=(ns, ns))
    return path


def tenant_file(tmp_path: Path, **fields: str) -> Path:
    """A file with tenant 'ads' (priority 10, quota 4) and `fields` (TOML values) set."""
    values = {"priority": "10", "quota_gpus": "4", **fields}
    body = "".join(f"{k} = {v}\n" for k, v in values.items())
    return write(tmp_path / "t.toml", f"[tenants.ads]\n{body}")


# --- validation --------------------------------------------------------------------------

INT32 = "a whole number in [-2147483648, 2147483647]"
GPUS = "a whole number of GPUs in [0, 1048576]"
MIN_RUN = "a number of seconds in [0, 604800]"
GRACE = "a number of seconds in (0, 86400]"
PER_DAY = "a whole number in [0, 1440]"
BAD_FIELDS = [
    ("priority", "true", f"true is not {INT32}"),
    ("priority", "1.5", f"1.5 is not {INT32}"),
    ("priority", '"high"', f'"high" is not {INT32}'),
    ("priority", "2147483648", f"2147483648 is not {INT32}"),
    ("priority", "-2147483649", f"-2147483649 is not {INT32}"),
    ("quota_gpus", "-1", f"-1 is not {GPUS}"),
    ("quota_gpus", "true", f"true is not {GPUS}"),
    ("quota_gpus", "4.0", f"4.0 is not {GPUS}"),
    ("quota_gpus", '"4"', f'"4" is not {GPUS}'),
    ("quota_gpus", "nan", f"nan is not {GPUS}"),
    ("quota_gpus", "[4]", f"an array is not {GPUS}"),
    ("quota_gpus", "1048577", f"1048577 is not {GPUS}"),
    ("quota_gpus", "2147483647", f"2147483647 is not {GPUS}"),
    ("borrow_limit_gpus", "-3", f"-3 is not {GPUS}"),
    ("borrow_limit_gpus", "false", f"false is not {GPUS}"),
    ("borrow_limit_gpus", "1.5", f"1.5 is not {GPUS}"),
    ("borrow_limit_gpus", "9223372036854775807", f"9223372036854775807 is not {GPUS}"),
    ("preemptible", "1", "1 is not true or false"),
    ("preemptible", '"yes"', '"yes" is not true or false'),
    ("preemptible", "{}", "a table is not true or false"),
    ("min_run_s", "-1", f"-1 is not {MIN_RUN}"),
    ("min_run_s", "-0.5", f"-0.5 is not {MIN_RUN}"),
    ("min_run_s", "nan", f"nan is not {MIN_RUN}"),
    ("min_run_s", "inf", f"inf is not {MIN_RUN}"),
    ("min_run_s", "true", f"true is not {MIN_RUN}"),
    ("min_run_s", '"10m"', f'"10m" is not {MIN_RUN}'),
    ("min_run_s", "1979-05-27", f"1979-05-27 is not {MIN_RUN}"),
    ("min_run_s", "604800.5", f"604800.5 is not {MIN_RUN}"),
    ("min_run_s", "1e308", f"1e+308 is not {MIN_RUN}"),
    ("grace_s", "0", f"0 is not {GRACE}"),
    ("grace_s", "0.0", f"0.0 is not {GRACE}"),
    ("grace_s", "-5", f"-5 is not {GRACE}"),
    ("grace_s", "-inf", f"-inf is not {GRACE}"),
    ("grace_s", "false", f"false is not {GRACE}"),
    ("grace_s", "1e308", f"1e+308 is not {GRACE}"),
    ("grace_s", "86401", f"86401 is not {GRACE}"),
    ("grace_s", "inf", f"inf is not {GRACE}"),
    ("max_preemptions_per_day", "-1", f"-1 is not {PER_DAY}"),
    ("max_preemptions_per_day", "2.5", f"2.5 is not {PER_DAY}"),
    ("max_preemptions_per_day", "true", f"true is not {PER_DAY}"),
    ("max_preemptions_per_day", "1441", f"1441 is not {PER_DAY}"),
]


@pytest.mark.parametrize(("key", "value", "says"), BAD_FIELDS)
def test_a_bad_tenant_field_names_file_tenant_field_and_value(
        tmp_path: Path, key: str, value: str, says: str) -> None:
    f = tenant_file(tmp_path, **{key: value})
    with pytest.raises(TenantsError) as err:
        load_tenants(f)
    assert str(err.value) == f"tenants file {f}: tenant 'ads': {key}: {says}"


def test_the_example_of_the_brief_reads_as_written(tmp_path: Path) -> None:
    f = tenant_file(tmp_path, quota_gpus="-1")
    with pytest.raises(TenantsError, match=r"^tenants file .*/t\.toml: tenant 'ads': "
                                           r"quota_gpus: -1 is not a whole number of GPUs "
                                           r"in \[0, 1048576\]$"):
        load_tenants(f)


AGING = "a number of priority points per hour in [0, 1000000]"
DAY = "a number of seconds in [0, 86400]"
PRICE = limits.CHECKPOINT_WAIT_PRICE.why(-1)
CAPACITY = "a whole number of GPUs in [1, 1048576]"
BAD_SCHEDULING = [
    ("aging_per_hour", "-1", f"-1 is not {AGING}"),
    ("aging_per_hour", "nan", f"nan is not {AGING}"),
    ("aging_per_hour", "true", f"true is not {AGING}"),
    ("aging_per_hour", "1e308", f"1e+308 is not {AGING}"),
    ("aging_per_hour", "1000000.5", f"1000000.5 is not {AGING}"),
    ("default_queue", '""', '"" is not a queue name (a non-empty string without blanks)'),
    ("default_queue", '"g p"', '"g p" is not a queue name (a non-empty string without '
                               'blanks)'),
    ("cpu_queue", "3", "3 is not a queue name (a non-empty string without blanks)"),
    ("capacity_gpus", "0", f"0 is not {CAPACITY}"),
    ("capacity_gpus", "2.5", f"2.5 is not {CAPACITY}"),
    ("capacity_gpus", "1048577", f"1048577 is not {CAPACITY}"),
    ("capacity_gpus", "true", f"true is not {CAPACITY}"),
    ("preemption", '"yes"', '"yes" is not true or false'),
    ("resume_after_s", "-3", f"-3 is not {DAY}"),
    ("resume_after_s", "1e12", f"1000000000000.0 is not {DAY}"),
    ("resume_after_s", "86400.001", f"86400.001 is not {DAY}"),
    ("resume_after_s", "inf", f"inf is not {DAY}"),
    ("resume_after_s", "nan", f"nan is not {DAY}"),
    ("checkpoint_wait_price", "-1", f"-1 is not {PRICE}"),
    ("checkpoint_wait_price", "inf", f"inf is not {PRICE}"),
    ("checkpoint_wait_price", "2e6", f"2000000.0 is not {PRICE}"),
    ("checkpoint_wait_price", '"1"', f'"1" is not {PRICE}'),
    ("checkpoint_wait_s", "1800", "replaced by checkpoint_wait_price, a "
                                  "price on the waiting job's wait instead of a bound "
                                  "(docs/decisions/0015-preemption.md): remove it, or set "
                                  "checkpoint_wait_price (default 0.25)"),
]


def test_the_preemption_knobs(tmp_path: Path) -> None:
    plain = load_tenants(write(tmp_path / "a.toml", GOOD))
    assert (plain.capacity_gpus, plain.preemption, plain.resume_after_s,
            plain.checkpoint_wait_price) == (None, False, 30.0, DEFAULT_WAIT_PRICE)
    assert plain.fleet_gpus == sum(t.quota_gpus for t in plain.tenants.values())
    knobs = ("[scheduling]\ncapacity_gpus = 64\npreemption = true\nresume_after_s = 5\n"
             "checkpoint_wait_price = 0\n")
    set_ = load_tenants(write(tmp_path / "b.toml", GOOD + knobs))
    assert (set_.fleet_gpus, set_.preemption, set_.resume_after_s,
            set_.checkpoint_wait_price) == (64, True, 5.0, 0.0)


@pytest.mark.parametrize(("key", "value", "says"), BAD_SCHEDULING)
def test_a_bad_scheduling_knob_is_named(tmp_path: Path, key: str, value: str,
                                        says: str) -> None:
    f = write(tmp_path / "t.toml", f"{GOOD}[scheduling]\n{key} = {value}\n")
    with pytest.raises(TenantsError) as err:
        load_tenants(f)
    assert str(err.value) == f"tenants file {f}: [scheduling]: {key}: {says}"


_INT64 = (-(2**63), 2**63 - 1)  # what a TOML integer can be
TENANT_RANGES = {"priority": limits.PRIORITY, "quota_gpus": limits.QUOTA_GPUS,
                 "borrow_limit_gpus": limits.BORROW_LIMIT_GPUS, "min_run_s": limits.MIN_RUN_S,
                 "grace_s": limits.GRACE_S,
                 "max_preemptions_per_day": limits.PREEMPTIONS_PER_DAY,
                 "max_tts_s": limits.MAX_TTS_S}
SCHEDULING_RANGES = {"aging_per_hour": limits.AGING_PER_HOUR,
                     "capacity_gpus": limits.CAPACITY_GPUS,
                     "resume_after_s": limits.RESUME_AFTER_S,
                     "checkpoint_wait_price": limits.CHECKPOINT_WAIT_PRICE}


def _outside(rng: Range) -> st.SearchStrategy[object]:
    """Any value a TOML file can hold that `rng` refuses: below or above it (as an integer
    or a float), NaN and the infinities, a boolean, and a float where whole numbers go."""
    lo, hi = int(rng.lo), int(rng.hi)
    below = [st.integers(_INT64[0], lo - 1 + rng.lo_open),
             st.floats(max_value=rng.lo, exclude_max=not rng.lo_open, allow_nan=False)]
    above = [st.integers(hi + 1 - rng.hi_open, _INT64[1]),
             st.floats(min_value=rng.hi, exclude_min=not rng.hi_open, allow_nan=False)]
    odd = [st.sampled_from([math.nan, math.inf, -math.inf]), st.booleans()]
    if rng.whole:
        odd.append(st.floats(allow_nan=False))
    return st.one_of(*below, *above, *odd)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), key=st.sampled_from([*TENANT_RANGES, *SCHEDULING_RANGES]))
def test_any_value_out_of_its_range_is_refused_naming_field_and_value(
        tmp_path: Path, data: st.DataObject, key: str) -> None:
    rng = TENANT_RANGES.get(key) or SCHEDULING_RANGES[key]
    value = data.draw(_outside(rng), label=key)
    where = "tenant 'ads'" if key in TENANT_RANGES else "[scheduling]"
    fields = {"priority": "1", "quota_gpus": "0", key: _toml_value(value)}
    text = ("[tenants.ads]\n" + "".join(f"{k} = {v}\n" for k, v in fields.items())
            if key in TENANT_RANGES
            else f"{GOOD}[scheduling]\n{key} = {_toml_value(value)}\n")
    f = write(tmp_path / "t.toml", text)
    with pytest.raises(TenantsError) as err:
        load_tenants(f)
    assert str(err.value) == f"tenants file {f}: {where}: {key}: {_shown(value)} is not {rng}"


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def test_a_quota_above_the_fleet_is_refused_and_quotas_above_it_in_sum_are_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    two = GOOD + "[tenants.batch]\npriority = 1\nquota_gpus = 4\n"
    fits = load_tenants(write(tmp_path / "a.toml", f"{two}[scheduling]\ncapacity_gpus = 8\n"))
    assert tenants.overcommitted(fits) is None
    assert tenants.overcommitted(load_tenants(write(tmp_path / "b.toml", two))) is None
    over = load_tenants(write(tmp_path / "c.toml", f"{two}[scheduling]\ncapacity_gpus = 6\n"))
    assert tenants.overcommitted(over) == (
        f"tenants file {tmp_path / 'c.toml'}: the quotas add up to 8 GPUs, more than "
        "[scheduling] capacity_gpus 6: the guarantees cannot all be kept at once")
    with caplog.at_level(logging.WARNING, logger="airflow_ett.scheduling.tenants"):
        assert TenantsCache().current(tmp_path / "c.toml").config == over
    assert "the quotas add up to 8 GPUs" in caplog.text
    f = write(tmp_path / "d.toml", f"{two}[scheduling]\ncapacity_gpus = 3\n")
    with pytest.raises(TenantsError) as err:
        load_tenants(f)
    assert str(err.value) == (f"tenants file {f}: tenant 'ads': quota_gpus: 4 is more than "
                              "[scheduling] capacity_gpus 3 (a guarantee the fleet cannot "
                              "give)")


KNOWN = ("priority, quota_gpus, borrow_limit_gpus, preemptible, min_run_s, grace_s, "
         "max_preemptions_per_day, max_tts_s")
NAME_RULE = ("not a valid tenant name (1 to 50 letters, digits, '_' or '-': it names the "
             "Airflow pool ett_tenant_<name>)")
BAD_FILES = [
    ("", "no tenants (add a [tenants.<name>] table for each)"),
    ("[tenants]\n", "no tenants (add a [tenants.<name>] table for each)"),
    ("[scheduling]\naging_per_hour = 2\n", "no tenants (add a [tenants.<name>] table for each)"),
    (f"pools = 1\n{GOOD}", "unknown top-level key 'pools' (only [tenants.<name>] tables and "
                           "a [scheduling] table)"),
    ("tenants = 3\n", "'tenants' must be tables [tenants.<name>], got 3"),
    ("tenants = [1]\n", "'tenants' must be tables [tenants.<name>], got an array"),
    ("[tenants]\nads = 3\n", "tenant 'ads': must be a table [tenants.ads], got 3"),
    ("[tenants.ads]\npriority = 1\nquota = 4\n",
     f"tenant 'ads': quota: unknown field (did you mean 'quota_gpus'? known: {KNOWN})"),
    ("[tenants.ads]\npriority = 1\nowner = 'x'\n",
     f"tenant 'ads': owner: unknown field (known: {KNOWN})"),
    ("[tenants.ads]\nquota_gpus = 4\n",
     "tenant 'ads': priority: missing (a whole number; the higher goes first)"),
    ("[tenants.ads]\npriority = 1\n",
     "tenant 'ads': quota_gpus: missing (a whole number >= 0: the GPUs the tenant is "
     "guaranteed)"),
    ('[tenants."a b"]\npriority = 1\nquota_gpus = 1\n', f"tenant 'a b': {NAME_RULE}"),
    ('[tenants."a.b"]\npriority = 1\nquota_gpus = 1\n', f"tenant 'a.b': {NAME_RULE}"),
    ('[tenants.""]\npriority = 1\nquota_gpus = 1\n', f"tenant '': {NAME_RULE}"),
    ('[tenants."régie"]\npriority = 1\nquota_gpus = 1\n', f"tenant 'régie': {NAME_RULE}"),
    (f"[tenants.{'a' * 51}]\npriority = 1\nquota_gpus = 1\n", f"tenant '{'a' * 51}': {NAME_RULE}"),
    (f"{GOOD}[tenants.Ads]\npriority = 1\nquota_gpus = 1\n",
     "tenants 'ads' and 'Ads' differ only in case (their pools would clash on a "
     "case-insensitive database)"),
    (f"{GOOD}[scheduling]\ncapacity_gpus = 3\n",
     "tenant 'ads': quota_gpus: 4 is more than [scheduling] capacity_gpus 3 (a guarantee the "
     "fleet cannot give)"),
    (f"scheduling = 1\n{GOOD}", "[scheduling]: must be a table, got 1"),
    (f"{GOOD}scheduling = 1\n", f"tenant 'ads': scheduling: unknown field (known: {KNOWN})"),
    (f"{GOOD}[scheduling]\naging = 2\n", "[scheduling]: aging: unknown field (did you mean "
                                         "'aging_per_hour'? known: aging_per_hour, "
                                         "default_queue, cpu_queue, capacity_gpus, preemption, "
                                         "resume_after_s, checkpoint_wait_price)"),
]


@pytest.mark.parametrize(("text", "says"), BAD_FILES)
def test_a_bad_file_is_refused_whole(tmp_path: Path, text: str, says: str) -> None:
    f = write(tmp_path / "t.toml", text)
    with pytest.raises(TenantsError) as err:
        load_tenants(f)
    assert str(err.value) == f"tenants file {f}: {says}"


def test_a_file_that_is_not_toml_missing_or_unreadable(tmp_path: Path) -> None:
    f = write(tmp_path / "t.toml", "[tenants.ads\npriority = 1\n")
    with pytest.raises(TenantsError, match=r"t\.toml: not valid TOML: .*line 1"):
        load_tenants(f)
    (tmp_path / "latin1.toml").write_bytes(b"# r\xe9gie\n" + GOOD.encode())
    with pytest.raises(TenantsError, match=r"latin1\.toml: not UTF-8 text"):
        load_tenants(tmp_path / "latin1.toml")
    with pytest.raises(TenantsError, match=r"^tenants file .*/nope\.toml: not found$"):
        load_tenants(tmp_path / "nope.toml")
    with pytest.raises(TenantsError, match=r"^tenants file .*: not a regular file \(a dir"):
        load_tenants(tmp_path)


@pytest.mark.parametrize(("kind", "make"), HOSTILE_TOML)
def test_a_hostile_file_is_one_line_at_once(tmp_path: Path, kind: str, make: Any) -> None:
    """A FIFO, /dev/zero behind a symlink, 200 MB, not UTF-8, 5,000 levels deep: each
    refused at once with one line (before, a FIFO or /dev/zero hung the reader and the
    nesting raised RecursionError)."""
    f = tmp_path / "t.toml"
    says = make(f)
    with pytest.raises(TenantsError) as err:
        in_thread(lambda: load_tenants(f))
    assert str(err.value).startswith(f"tenants file {f}: {says}"), err.value
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("kind", "make"), HOSTILE_TOML)
def test_a_hostile_replacement_keeps_the_last_good_version(tmp_path: Path, kind: str,
                                                           make: Any) -> None:
    """The cache the cluster policies and the controller read never raises and never drops
    the version in force, whatever replaces the file."""
    cache = TenantsCache(clock=Clock())
    f = write(tmp_path / "t.toml", GOOD)
    good = cache.current(f)
    f.unlink()
    says = make(f)
    state = in_thread(lambda: cache.current(f))
    assert state.config is good.config and state.stale
    assert state.error is not None and state.error.startswith(f"tenants file {f}: {says}")


def test_defaults_fill_in_what_a_tenant_leaves_out(tmp_path: Path) -> None:
    config = load_tenants(write(tmp_path / "t.toml", GOOD))
    assert config.tenants == {"ads": TenantPolicy(
        name="ads", priority=10, quota_gpus=4, borrow_limit_gpus=0, preemptible=True,
        min_run_s=600.0, grace_s=120.0, max_preemptions_per_day=2)}
    assert (config.aging_per_hour, config.default_queue, config.cpu_queue) == (1.0, "gpu",
                                                                              "cpu")
    assert config.source == str(tmp_path / "t.toml")
    assert config.digest == hashlib.sha256(GOOD.encode()).hexdigest()
    assert config.pools == {"ads": "ett_tenant_ads"}
    assert isinstance(config.tenants["ads"].min_run_s, float)  # `600` in TOML is an int


def test_integers_are_accepted_for_seconds_and_negative_priorities(tmp_path: Path) -> None:
    f = tenant_file(tmp_path, priority="-5", min_run_s="0", grace_s="0.5",
                    quota_gpus="0", preemptible="false")
    policy = load_tenants(f).get("ads")
    assert (policy.priority, policy.quota_gpus, policy.min_run_s, policy.grace_s,
            policy.preemptible) == (-5, 0, 0.0, 0.5, False)


def test_an_unknown_tenant_names_the_known_ones(tmp_path: Path) -> None:
    config = load_tenants(EXAMPLE)
    with pytest.raises(UnknownTenantError) as err:
        config.get("ads")
    assert str(err.value) == (f"unknown tenant 'ads': tenants file {EXAMPLE} names "
                              "'ads-ranking', 'feed-recs', 'foundation-models', "
                              "'ml-platform-ci'")
    assert isinstance(err.value, TenantsError)


def test_the_example_file_loads() -> None:
    config = load_tenants(EXAMPLE)
    assert list(config.tenants) == ["ads-ranking", "feed-recs", "foundation-models",
                                    "ml-platform-ci"]
    assert sum(p.quota_gpus for p in config.tenants.values()) == 64  # as its comment says
    assert config.get("foundation-models").preemptible is False
    assert config.get("ads-ranking").limit_gpus == 40
    assert config.get("ml-platform-ci").min_run_s == 0.0
    assert (config.aging_per_hour, config.default_queue, config.cpu_queue) == (1.0, "gpu",
                                                                              "cpu")


# --- every valid file loads back as written (property) ------------------------------------

def _in(rng: Range) -> st.SearchStrategy[int | float]:
    """Any value `rng` holds, as the file may write it: an integer, or (unless whole) a
    float, the ends included unless open."""
    lo, hi = int(rng.lo), int(rng.hi)
    ints = st.integers(lo + rng.lo_open, hi - rng.hi_open)
    if rng.whole:
        return ints
    return st.one_of(ints, st.floats(rng.lo, rng.hi, exclude_min=rng.lo_open,
                                     exclude_max=rng.hi_open))


_policies = st.fixed_dictionaries({
    "priority": _in(limits.PRIORITY),
    "quota_gpus": _in(limits.QUOTA_GPUS),
}, optional={
    "borrow_limit_gpus": _in(limits.BORROW_LIMIT_GPUS),
    "preemptible": st.booleans(),
    "min_run_s": _in(limits.MIN_RUN_S),
    "grace_s": _in(limits.GRACE_S),
    "max_preemptions_per_day": _in(limits.PREEMPTIONS_PER_DAY),
})
_names = st.lists(st.from_regex(r"[A-Za-z0-9_-]{1,50}", fullmatch=True), min_size=1,
                  max_size=6, unique_by=str.lower)
_knobs = st.fixed_dictionaries({}, optional={
    "aging_per_hour": _in(limits.AGING_PER_HOUR),
    "resume_after_s": _in(limits.RESUME_AFTER_S),
    "checkpoint_wait_price": _in(limits.CHECKPOINT_WAIT_PRICE),
    "default_queue": st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True),
    "cpu_queue": st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True),
})


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # Python's shortest round-trip form is valid TOML (1e-05, 600.0)
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _to_toml(policies: dict[str, dict[str, Any]], knobs: dict[str, Any]) -> str:
    out = []
    for name, fields in policies.items():
        out.append(f"[tenants.{name}]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in fields.items())
    if knobs:
        out.append("[scheduling]")
        out.extend(f"{k} = {_toml_value(v)}" for k, v in knobs.items())
    return "\n".join(out) + "\n"


def _policy(name: str, fields: dict[str, Any]) -> TenantPolicy:
    """What a generated tenant table should load as: seconds as floats, the rest as written
    (what it leaves out takes TenantPolicy's defaults)."""
    values: dict[str, Any] = {k: float(v) if k in ("min_run_s", "grace_s") else v
                              for k, v in fields.items()}
    return TenantPolicy(name=name, **values)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=_names, data=st.data(), knobs=_knobs)
def test_any_valid_config_written_as_toml_loads_back_equal(
        tmp_path: Path, names: list[str], data: st.DataObject, knobs: dict[str, Any]) -> None:
    policies = {name: data.draw(_policies, label=name) for name in names}
    text = _to_toml(policies, knobs)
    f = tmp_path / "t.toml"
    f.write_text(text, encoding="utf-8")
    expected = TenantsConfig(
        tenants={name: _policy(name, fields) for name, fields in policies.items()},
        source=str(f), digest=hashlib.sha256(text.encode()).hexdigest(),
        **{k: float(v) if k.endswith("_s") else v for k, v in knobs.items()})
    loaded = load_tenants(f)
    assert loaded == expected
    assert list(loaded.tenants) == names  # in file order


# --- the last good version ----------------------------------------------------------------


class Clock:
    """A clock that says 1000, 1001, ...: each stamp tells when it was taken."""

    def __init__(self) -> None:
        self.now = 999.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources the cache parsed, in order (each entry is one parse of the file)."""
    seen: list[str] = []
    real = tenants.parse_tenants

    def counting(data: bytes, *, source: str) -> TenantsConfig:
        seen.append(source)
        return real(data, source=source)

    monkeypatch.setattr(tenants, "parse_tenants", counting)
    return seen


BROKEN = "[tenants.ads]\npriority = 10\nquota_gpus = -1\n"
V2 = "[tenants.ads]\npriority = 20\nquota_gpus = 6\n"


def test_a_broken_edit_keeps_the_last_good_version_in_force(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="airflow_ett.scheduling.tenants")
    cache = TenantsCache(clock=Clock())
    f = write(tmp_path / "t.toml", GOOD)
    good = cache.current(f)
    assert good.config is not None and good.config.get("ads").quota_gpus == 4
    assert (good.error, good.error_at, good.loaded_at, good.stale) == (None, None, 1000.0,
                                                                       False)

    write(f, BROKEN)
    broken = cache.current(f)
    assert broken.config is good.config  # the old version stays in force
    assert broken.error == (f"tenants file {f}: tenant 'ads': quota_gpus: -1 is not a whole "
                            "number of GPUs in [0, 1048576]")
    assert (broken.error_at, broken.loaded_at, broken.stale) == (1001.0, 1000.0, True)
    assert cache.current(f) is broken  # unchanged file: nothing re-read, nothing re-logged
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"{broken.error}; the version loaded at 1970-01-01 00:16:40 UTC "
                        "stays in force"]

    write(f, V2)
    fixed = cache.current(f)
    assert fixed.config is not None and fixed.config.get("ads").quota_gpus == 6
    assert (fixed.error, fixed.stale, fixed.loaded_at) == (None, False, 1002.0)


def test_a_file_deleted_after_a_good_version_keeps_that_version(tmp_path: Path) -> None:
    cache = TenantsCache(clock=Clock())
    f = write(tmp_path / "t.toml", GOOD)
    good = cache.current(f).config
    f.unlink()
    state = cache.current(f)
    assert state.config is good
    assert state.error == f"tenants file {f}: not found"


def test_a_file_never_good_has_no_config_and_its_error(tmp_path: Path) -> None:
    cache = TenantsCache(clock=Clock())
    f = tmp_path / "t.toml"
    missing = cache.current(f)
    assert (missing.config, missing.error, missing.error_at) == (
        None, f"tenants file {f}: not found", 1000.0)
    write(f, BROKEN)
    broken = cache.current(f)
    assert broken.config is None and broken.error is not None and "quota_gpus" in broken.error
    assert broken.path == str(f) and not broken.stale
    write(f, GOOD)
    assert cache.current(f).config is not None


def test_the_file_is_read_again_only_when_it_changed(tmp_path: Path,
                                                     parses: list[str]) -> None:
    cache = TenantsCache()
    f = write(tmp_path / "t.toml", GOOD)
    first = cache.current(f)
    for _ in range(200):
        assert cache.current(f) is first
    assert len(parses) == 1
    write(f, V2)
    changed = cache.current(f)
    assert changed.config == load_tenants(f)
    assert len(parses) == 3  # the cache's second parse, and the load_tenants just above
    os.utime(f, ns=(time.time_ns() - 10**11,) * 2)  # touched, same bytes: read, not parsed
    assert cache.current(f) is changed
    assert len(parses) == 3


def test_a_file_changed_just_now_is_not_trusted_on_its_signature(tmp_path: Path) -> None:
    """Rewritten within the mtime clock's tick, to the same size: a settled signature would
    miss the change; a file modified less than RACY_S ago is read again at each call."""
    cache = TenantsCache()
    f = write(tmp_path / "t.toml", GOOD, age_s=None)
    stamp = f.stat().st_mtime_ns
    assert cache.current(f).config.get("ads").quota_gpus == 4  # type: ignore[union-attr]
    same_size = GOOD.replace("quota_gpus = 4", "quota_gpus = 5")
    write(f, same_size, age_s=None)
    os.utime(f, ns=(stamp, stamp))  # the same mtime and size: the same signature
    assert cache.current(f).config.get("ads").quota_gpus == 5  # type: ignore[union-attr]
    assert RACY_S >= 1.0


def test_paths_are_cached_apart_and_clear_forgets(tmp_path: Path, parses: list[str]) -> None:
    cache = TenantsCache()
    a, b = write(tmp_path / "a.toml", GOOD), write(tmp_path / "b.toml", V2)
    assert cache.current(a).config.get("ads").priority == 10  # type: ignore[union-attr]
    assert cache.current(b).config.get("ads").priority == 20  # type: ignore[union-attr]
    cache.current(a)
    assert len(parses) == 2
    cache.clear()
    cache.current(a)
    assert len(parses) == 3


def test_the_module_cache_serves_current(tmp_path: Path) -> None:
    f = write(tmp_path / "t.toml", GOOD)
    assert tenants.current(f) is tenants.current(str(f))


def test_concurrent_calls_see_only_whole_versions_and_load_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads read while the file is rewritten in place (a reader may catch it half
    written): each sees a whole good version, never an exception; loads never overlap;
    when the writes stop, all see the last version."""
    inside, overlaps = [0], [0]
    guard = threading.Lock()
    real = tenants.parse_tenants

    def watched(data: bytes, *, source: str) -> TenantsConfig:
        with guard:
            inside[0] += 1
            overlaps[0] += inside[0] > 1
        try:
            time.sleep(0.001)  # widen the window another loader would have to overlap in
            return real(data, source=source)
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(tenants, "parse_tenants", watched)
    versions = [f"[tenants.ads]\npriority = {p}\nquota_gpus = {p}\n# {'x' * p}\n"
                for p in range(1, 31)]
    f = write(tmp_path / "t.toml", versions[0])
    cache = TenantsCache()
    seen: set[int] = set()
    errors: list[BaseException] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                state = cache.current(f)
                assert state.config is not None
                seen.add(state.config.get("ads").priority)
        except BaseException as exc:  # surfaced in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for t in threads:
        t.start()
    for text in versions[1:]:
        write(f, text, age_s=None)  # in place, just now: racy, re-read at every call
        time.sleep(0.005)
    time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert overlaps[0] == 0
    assert seen <= set(range(1, 31)) and len(seen) > 1
    final = cache.current(f)
    assert final.config is not None and final.config.get("ads").priority == 30
    assert final.error is None


# --- [ett] tenants_file --------------------------------------------------------------------


def test_the_setting_empty_means_no_tenants_file() -> None:
    assert provider.CONFIG_DEFAULTS["tenants_file"] == ""  # the default: plugin off
    assert tenants_file_from_settings() is None


def test_the_setting_names_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__ETT__TENANTS_FILE", " ~/tenants.toml ")
    assert tenants_file_from_settings() == Path.home() / "tenants.toml"
    monkeypatch.setenv("AIRFLOW__ETT__TENANTS_FILE", "  ")
    assert tenants_file_from_settings() is None


def test_an_unreadable_config_is_a_tenants_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text("[ett]\ntenants_file = /x\n[ett]\n")  # a section twice: configparser error
    monkeypatch.setenv("AIRFLOW_CONFIG", str(cfg))
    with pytest.raises(TenantsError,
                       match=r"cannot read \[ett\] tenants_file from .*airflow\.cfg"):
        tenants_file_from_settings()
