"""The nightly rollup's alerts, judged from stored days: a breached SLO, a regression
against the baseline, the tenants and models that moved it, one alert per component."""

from __future__ import annotations

import datetime as dt
import tomllib

import pytest

from airflow_ett.rollup.alerts import Alert, day_alerts, fleet_link
from airflow_ett.rollup.components import ComponentsConfig, load_components, parse_components
from tests.rollup.alert_days import BAD_DAY, bad_day, baseline, baseline_day, day, job

URL = "https://airflow.example.com/ett/"


def _components(text: str = "") -> ComponentsConfig:
    bundled = load_components()
    if not text:
        return bundled
    return parse_components(tomllib.loads(text), source="c.toml")


def _only(alerts: list[Alert], component: str) -> Alert:
    (alert,) = [a for a in alerts if a.component == component]
    return alert


def test_a_bad_day_names_the_component_owner_change_movers_and_link() -> None:
    components = _components()
    alerts = day_alerts(bad_day(components), baseline(components), components, fleet_url=URL)
    init = _only(alerts, "initialization")
    assert init.reasons == ["slo_breach", "regression"]
    assert init.owner == "trainer-team" and init.target == "<1%"
    assert init.share_pct == pytest.approx(100 * (500 + 50 + 50) / 30_000)  # 2.0%
    assert init.baseline_pct == pytest.approx(0.5)
    assert init.change_points == pytest.approx(1.5)
    assert init.baseline_days == ["2026-11-25", "2026-11-26", "2026-11-27"]
    assert [m.name for m in init.tenants] == ["ads"]  # search's jobs did not change
    assert init.tenants[0].before_pct == pytest.approx(0.5)
    assert init.tenants[0].now_pct == pytest.approx(5.0)
    assert [m.name for m in init.models] == ["ctr"]
    assert init.link == "https://airflow.example.com/ett/?from=2026-11-28&to=2026-11-28"
    assert init.key == "2026-11-28/initialization"
    # ETT% (98%) meets the bundled >=90%, but it fell 1.5 points, past the 1-point
    # threshold: effective training has an alert of its own
    ett = _only(alerts, "effective_training")
    assert ett.reasons == ["regression"] and ett.owner == "ml-platform"
    assert ett.change_points == pytest.approx(-1.5)
    assert [m.name for m in ett.tenants] == ["ads"] and ett.tenants[0].points < 0
    assert [a.component for a in alerts] == ["initialization", "effective_training"]


def test_the_message_says_it_all_in_one_line_subject_text_and_escaped_html() -> None:
    components = _components()
    alert = _only(day_alerts(bad_day(components), baseline(components), components,
                             fleet_url=URL), "initialization")
    assert alert.subject == ("[ETT] initialization SLO breached and regression on 2026-11-28: "
                             "2.00% (SLO <1%, +1.50 points vs baseline) - trainer-team")
    text = alert.text
    for piece in ("owner: trainer-team", "initialization's share on 2026-11-28: 2.00% of the "
                  "fleet's GPU time (SLO <1%: BREACH)", "baseline (3 day(s), "
                  "2026-11-25..2026-11-27): 0.50%, change +1.50 points (regression)",
                  "moved by tenant ads: +1.50 points (0.50% -> 5.00%)",
                  "moved by model ctr:", f"fleet page: {alert.link}"):
        assert piece in text
    assert '<a href="https://airflow.example.com/ett/?from=2026-11-28&amp;to=2026-11-28">' \
        in alert.html


def test_a_name_with_markup_is_escaped_in_the_html_body() -> None:
    components = _components()
    evil = "<script>alert(1)</script>"
    today = day(BAD_DAY, [job("e", evil, "ctr", 8, {"initialization": 900})], components)
    alert = _only(day_alerts(today, baseline(components), components, fleet_url=URL),
                  "initialization")
    assert alert.tenants[0].name == evil
    assert evil not in alert.html and "&lt;script&gt;" in alert.html


def test_a_breach_without_a_baseline_is_sent_with_no_change_and_no_movers() -> None:
    components = _components()
    alert = _only(day_alerts(bad_day(components), [], components, fleet_url=URL),
                  "initialization")
    assert alert.reasons == ["slo_breach"]
    assert alert.baseline_pct is None and alert.change_points is None
    assert alert.tenants == [] == alert.models
    assert "baseline: no stored day before it" in alert.text


def test_a_quiet_day_and_a_day_without_jobs_send_nothing() -> None:
    components = _components()
    steady = baseline_day(BAD_DAY, components)
    assert day_alerts(steady, baseline(components), components, fleet_url=URL) == []
    empty = day(BAD_DAY, [], components)
    assert day_alerts(empty, baseline(components), components, fleet_url=URL) == []


def test_the_regression_threshold_and_the_routes_come_from_the_file() -> None:
    components = _components('''
[alerts]
regression_points = 2.0
notify = ["all"]
fleet_url = "https://ops.example.com/airflow/ett"
[notifiers.all]
class = "m.All"
[notifiers.pager]
class = "m.Pager"
[components.initialization]
owner = "trainer-team"
notify = ["pager", "all"]
''')
    alerts = day_alerts(bad_day(components), baseline(components), components, fleet_url=URL)
    # no SLO in this file, and +1.5 points is under the 2-point threshold: nothing
    assert alerts == []
    worse = day(BAD_DAY, [job("a", "ads", "ctr", 8, {"initialization": 900}),
                          job("s", "search", "rank", 8, {"initialization": 50})], components)
    alert, ett = day_alerts(worse, baseline(components), components, fleet_url=URL)
    assert alert.component == "initialization" and alert.reasons == ["regression"]
    assert alert.notify == ["all", "pager"]  # [alerts] notify first, then the component's
    assert ett.component == "effective_training" and ett.notify == ["all"]
    assert alert.link.startswith("https://ops.example.com/airflow/ett/?from=2026-11-28")


def test_the_baseline_weighs_gpu_time_and_skips_days_without_any() -> None:
    components = _components()
    big = day(BAD_DAY - dt.timedelta(days=1),
              [job("big", "ads", "ctr", 64, {"initialization": 0})], components)
    small = day(BAD_DAY - dt.timedelta(days=2),
                [job("small", "ads", "ctr", 1, {"initialization": 1000})], components)
    empty = day(BAD_DAY - dt.timedelta(days=3), [], components)
    alert = _only(day_alerts(bad_day(components), [empty, small, big], components,
                             fleet_url=URL), "initialization")
    assert alert.baseline_pct == pytest.approx(100 * 1000 * 1 / (10_000 * 65))
    assert alert.baseline_days == ["2026-11-26", "2026-11-27"]


def test_fleet_link_keeps_a_path_base() -> None:
    assert fleet_link("http://h/airflow/ett/", "2026-01-02") == \
        "http://h/airflow/ett/?from=2026-01-02&to=2026-01-02"


def test_a_model_that_entered_is_named_as_such() -> None:
    components = _components()
    today = day(BAD_DAY, [job("a", "ads", "ctr", 8, {"initialization": 50}),
                          job("s", "search", "rank", 8, {"initialization": 50}),
                          job("n", "search", "new", 8, {"initialization": 800})], components)
    alert = _only(day_alerts(today, baseline(components), components, fleet_url=URL),
                  "initialization")
    assert [m.name for m in alert.models] == ["new"]  # ctr and rank did not change
    assert "moved by model new: +2.50 points (- -> 8.00%; it entered)" in alert.text
