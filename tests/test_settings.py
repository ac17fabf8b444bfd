"""The `[ett]` settings, read without Airflow: environment > airflow.cfg > defaults.

Pure unit tests (no Airflow import). That Airflow's own `conf` reads the same values is
checked in tests/plugin/test_plugin.py, in a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_ett.provider import CONFIG_DEFAULTS
from airflow_ett.settings import EttSettings, SettingsError, airflow_home, raw_setting


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh AIRFLOW_HOME with no airflow.cfg and no AIRFLOW__ETT__* in the environment."""
    path = tmp_path / "airflow_home"
    path.mkdir()
    monkeypatch.setenv("AIRFLOW_HOME", str(path))
    monkeypatch.delenv("AIRFLOW_CONFIG", raising=False)
    for key in CONFIG_DEFAULTS:
        monkeypatch.delenv(f"AIRFLOW__ETT__{key.upper()}", raising=False)
    return path


def write_cfg(path: Path, **options: str) -> Path:
    lines = ["[core]", "load_examples = False", "", "[ett]"]
    lines += [f"{key} = {value}" for key, value in options.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_defaults_expand_airflow_home(home: Path) -> None:
    settings = EttSettings.load()
    assert settings == EttSettings(
        store_url=f"sqlite:///{home}/ett.db",
        disabled=False,
        spool_dir=home / "ett_spool",
        emit_timeout=2.0,
        work_dir=home / "ett_work",
    )


def test_airflow_home_defaults_to_user_airflow(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AIRFLOW_HOME", raising=False)
    monkeypatch.delenv("AIRFLOW_CONFIG", raising=False)
    monkeypatch.delenv("AIRFLOW__ETT__SPOOL_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert airflow_home() == tmp_path / "airflow"
    assert raw_setting("spool_dir") == f"{tmp_path}/airflow/ett_spool"


def test_every_default_is_a_known_key_and_loads(home: Path) -> None:
    for key in CONFIG_DEFAULTS:
        assert "{AIRFLOW_HOME}" not in raw_setting(key)


def test_airflow_cfg_overrides_default(home: Path) -> None:
    write_cfg(home / "airflow.cfg", store_url="postgresql+psycopg2://postgres@db/ett",
              emit_timeout="0.5")
    settings = EttSettings.load()
    assert settings.store_url == "postgresql+psycopg2://postgres@db/ett"
    assert settings.emit_timeout == 0.5
    assert settings.spool_dir == home / "ett_spool"  # not in the file: default


def test_environment_overrides_airflow_cfg(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cfg(home / "airflow.cfg", store_url="sqlite:////from/file.db", disabled="false")
    monkeypatch.setenv("AIRFLOW__ETT__STORE_URL", "sqlite:////from/env.db")
    monkeypatch.setenv("AIRFLOW__ETT__DISABLED", "true")
    settings = EttSettings.load()
    assert settings.store_url == "sqlite:////from/env.db"
    assert settings.disabled is True


def test_environment_overrides_default(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__ETT__SPOOL_DIR", "/var/spool/ett")
    assert EttSettings.load().spool_dir == Path("/var/spool/ett")


def test_empty_environment_value_still_wins(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_cfg(home / "airflow.cfg", disabled="true")
    monkeypatch.setenv("AIRFLOW__ETT__DISABLED", "")
    assert EttSettings.load().disabled is False


def test_airflow_config_variable_names_the_file(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_cfg(home / "airflow.cfg", store_url="sqlite:////ignored.db")
    other = write_cfg(tmp_path / "elsewhere.cfg", store_url="sqlite:////chosen.db")
    monkeypatch.setenv("AIRFLOW_CONFIG", str(other))
    assert raw_setting("store_url") == "sqlite:////chosen.db"


def test_other_sections_do_not_leak_into_ett(home: Path) -> None:
    (home / "airflow.cfg").write_text("[core]\nstore_url = nope\n", encoding="utf-8")
    assert raw_setting("store_url") == f"sqlite:///{home}/ett.db"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("True", True), ("1", True), ("yes", True), (" ON ", True),
     ("false", False), ("0", False), ("no", False), ("off", False)],
)
def test_disabled_accepts_boolean_spellings(
    home: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: bool
) -> None:
    monkeypatch.setenv("AIRFLOW__ETT__DISABLED", text)
    assert EttSettings.load().disabled is expected


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("disabled", "maybe"),
        ("emit_timeout", "abc"),
        ("emit_timeout", "0"),
        ("emit_timeout", "-1.5"),
        ("emit_timeout", "nan"),
        ("emit_timeout", "inf"),
        ("emit_timeout", "1e308"),
        ("emit_timeout", "300.5"),
    ],
)
def test_bad_values_name_key_and_value(
    home: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str
) -> None:
    monkeypatch.setenv(f"AIRFLOW__ETT__{key.upper()}", value)
    with pytest.raises(SettingsError) as excinfo:
        EttSettings.load()
    message = str(excinfo.value)
    assert key in message
    assert repr(value) in message


def test_the_emit_timeout_range_ends_are_accepted(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for text in ("0.001", "300"):
        monkeypatch.setenv("AIRFLOW__ETT__EMIT_TIMEOUT", text)
        assert EttSettings.load().emit_timeout == float(text)


def test_bad_value_in_airflow_cfg_is_reported_too(home: Path) -> None:
    write_cfg(home / "airflow.cfg", emit_timeout="soon")
    with pytest.raises(SettingsError, match=r"emit_timeout.*'soon'"):
        EttSettings.load()


def test_unknown_key_is_an_error_listing_the_known_ones(home: Path) -> None:
    with pytest.raises(SettingsError) as excinfo:
        raw_setting("store_uri")
    message = str(excinfo.value)
    assert "'store_uri'" in message
    for key in CONFIG_DEFAULTS:
        assert key in message


def test_unreadable_airflow_cfg_names_the_file(home: Path) -> None:
    cfg = home / "airflow.cfg"
    cfg.write_text("store_url = no section header\n", encoding="utf-8")
    with pytest.raises(SettingsError, match="cannot read") as excinfo:
        raw_setting("store_url")
    assert str(cfg) in str(excinfo.value)


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


def test_percent_escapes_in_airflow_cfg_read_as_airflow_reads_them(home: Path) -> None:
    write_cfg(home / "airflow.cfg", store_url="postgresql+psycopg2://ett:p%%40ss@db/ett")
    assert raw_setting("store_url") == "postgresql+psycopg2://ett:p%40ss@db/ett"


def test_a_lone_percent_is_a_clear_error_as_in_airflow(home: Path) -> None:
    write_cfg(home / "airflow.cfg", store_url="postgresql+psycopg2://ett:p%40ss@db/ett")
    with pytest.raises(SettingsError, match=r"cannot read \[ett\] store_url from .*airflow.cfg"):
        raw_setting("store_url")


def test_rollup_defaults(home: Path) -> None:
    from airflow_ett.settings import RollupSettings

    s = RollupSettings.load()
    assert (s.timezone, s.components_file, s.recompute_days, s.catchup_days) == (
        "UTC", None, 2, 30)
    assert s.report_dir == home / "ett_reports"
    assert (s.whatif_cut_pct, s.whatif_start_s, s.silent_after_s) == (50.0, 60.0, 86400.0)


@pytest.mark.parametrize(("key", "value", "message"), [
    ("rollup_timezone", "Mars/Olympus", "rollup_timezone must be an IANA time zone name"),
    ("rollup_recompute_days", "0", r"rollup_recompute_days must be in \[1, 366\], got '0'"),
    ("rollup_recompute_days", "367", r"rollup_recompute_days must be in \[1, 366\], got "
                                     "'367'"),
    ("rollup_catchup_days", "1000000000000", r"rollup_catchup_days must be in \[1, 3660\], "
                                             "got '1000000000000'"),
    ("rollup_catchup_days", "two", "rollup_catchup_days must be an integer, got 'two'"),
    ("whatif_cut_pct", "101", r"whatif_cut_pct must be in \[0, 100\], got '101'"),
    ("whatif_start_s", "-1", r"whatif_start_s must be in \[0, 86400\], got '-1'"),
    ("rollup_silent_after_s", "-5", r"rollup_silent_after_s must be in \[0, 3.1\d+e\+07\], "
                                    "got '-5'"),
    ("rollup_silent_after_s", "soon", "rollup_silent_after_s must be a number, got 'soon'"),
])
def test_a_bad_rollup_setting_names_itself_and_its_value(
        home: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str, message: str) -> None:
    from airflow_ett.settings import RollupSettings

    monkeypatch.setenv(f"AIRFLOW__ETT__{key.upper()}", value)
    with pytest.raises(SettingsError, match=rf"\[ett\] {message}"):
        RollupSettings.load()


def test_the_silent_bound_can_be_turned_off(home: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ett.settings import RollupSettings

    monkeypatch.setenv("AIRFLOW__ETT__ROLLUP_SILENT_AFTER_S", "0")
    assert RollupSettings.load().silent_after_s == 0.0


def test_rolling_defaults_and_spellings(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ett.settings import RollingSettings

    assert RollingSettings.load() == RollingSettings(windows_min=(5, 15, 60),
                                                     metrics_interval_s=60.0)
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_WINDOWS", " 60, 1,10080 ")
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_METRICS_INTERVAL_S", "10")
    loaded = RollingSettings.load()
    assert (loaded.windows_min, loaded.metrics_interval_s) == ((1, 60, 10080), 10.0)
    assert RollingSettings.load_windows() == (1, 60, 10080) and loaded.sends_metrics
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_METRICS_INTERVAL_S", "0")  # gauges off
    assert not RollingSettings.load().sends_metrics
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_METRICS_INTERVAL_S", "3600")
    monkeypatch.setenv("AIRFLOW__ETT__ROLLING_WINDOWS", "  ")  # no windows at all
    assert RollingSettings.load() == RollingSettings((), 3600.0)
    assert not RollingSettings.load().sends_metrics


@pytest.mark.parametrize(("key", "value", "message"), [
    ("rolling_windows", "5,,15", "rolling_windows must be whole minutes separated by commas, "
                                 "such as '5,15,60'; '' is not, in '5,,15'"),
    ("rolling_windows", "5m", "rolling_windows must be whole minutes separated by commas, "
                              "such as '5,15,60'; '5m' is not, in '5m'"),
    ("rolling_windows", "7.5", "'7.5' is not, in '7.5'"),
    ("rolling_windows", "-5", "'-5' is not, in '-5'"),
    ("rolling_windows", "0", "rolling_windows: each window must be 1 to 10080 minutes, got "
                             "'0' in '0'"),
    ("rolling_windows", "10081", "each window must be 1 to 10080 minutes, got '10081'"),
    ("rolling_windows", "9" * 5000, "each window must be 1 to 10080 minutes, got '999"),
    ("rolling_windows", "15,5,15", "rolling_windows names 15 minutes twice, in '15,5,15'"),
    ("rolling_windows", "1,2,3,4,5,6,7,8,9", "rolling_windows may name at most 8 windows, got "
                                             "9 in '1,2,3,4,5,6,7,8,9'"),
    ("rolling_metrics_interval_s", "soon", "rolling_metrics_interval_s must be a number of "
                                           "seconds, got 'soon'"),
    ("rolling_metrics_interval_s", "1", r"rolling_metrics_interval_s must be 0 \(off\) or in "
                                        r"\[10, 3600\], got '1'"),
    ("rolling_metrics_interval_s", "nan", r"or in \[10, 3600\], got 'nan'"),
    ("rolling_metrics_interval_s", "3601", r"or in \[10, 3600\], got '3601'"),
])
def test_a_bad_rolling_setting_names_itself_and_its_value(
        home: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str, message: str) -> None:
    from airflow_ett.settings import RollingSettings

    monkeypatch.setenv(f"AIRFLOW__ETT__{key.upper()}", value)
    with pytest.raises(SettingsError, match=r"^\[ett\] .*" + message) as excinfo:
        RollingSettings.load()
    assert "\n" not in str(excinfo.value)


def test_a_settled_config_file_is_parsed_once_and_again_when_it_changes(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_ett import settings

    cfg = write_cfg(home / "airflow.cfg", spool_dir="/a", work_dir="/w")
    monkeypatch.setattr(settings, "SETTLED_S", -1.0)  # as if written long ago
    assert raw_setting("spool_dir") == "/a"
    parsed = settings._parsed
    assert parsed is not None and parsed[0][0] == str(cfg)
    assert raw_setting("work_dir") == "/w" and settings._parsed is parsed  # not parsed again
    write_cfg(cfg, spool_dir="/bb", work_dir="/w")  # another size: a change the stat shows
    assert raw_setting("spool_dir") == "/bb" and settings._parsed is not parsed


def test_a_config_file_changed_just_now_is_read_again_at_every_read(home: Path) -> None:
    cfg = write_cfg(home / "airflow.cfg", spool_dir="/a")
    assert raw_setting("spool_dir") == "/a"
    write_cfg(cfg, spool_dir="/b")  # same size, maybe the same timestamps: still seen
    assert raw_setting("spool_dir") == "/b"
    cfg.unlink()
    assert raw_setting("spool_dir") == f"{home}/ett_spool"
