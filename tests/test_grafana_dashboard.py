"""The shipped Grafana dashboard queries only what the code sends (docs/grafana/).

The chain checked, end to end: the code's metrics (`job_metrics` of a simulated job, its
copies with the tags in the name, `emitter_counter_metrics`) go through a model of
statsd_exporter applying docs/grafana/statsd-mappings.yml (first matching glob rule; a
timer becomes a summary or, where the rule says, a histogram; milliseconds become
seconds), which gives the Prometheus series Prometheus would hold, with their labels and
label values. Every metric name that any PromQL expression of the dashboard (panels and
template variables) selects must be one of them, with matchers on labels it has and values
the code sends, and cumulative series read through a range (`increase`, `rate`). The
extractor is checked on its own, on expressions and on a dashboard with a bad panel. The
names docs/metrics.md documents are exactly the code's.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_ett.emit import EmitterStats
from airflow_ett.ett.attribution import attribute_job
from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.ett.synthetic import InjectedFailure, JobSpec, simulate
from airflow_ett.plugin.metrics import (
    EMITTER_COUNTERS,
    Metric,
    emitter_counter_metrics,
    job_metrics,
    with_tags_in_names,
)
from airflow_ett.plugin.window_metrics import window_metrics

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "grafana" / "airflow-ett.json"
MAPPINGS = ROOT / "docs" / "grafana" / "statsd-mappings.yml"
METRICS_DOC = ROOT / "docs" / "metrics.md"
STATSD_PREFIX = "airflow"  # Airflow's default `[metrics] statsd_prefix`
#: Labels Prometheus adds to every scraped series.
TARGET_LABELS = frozenset({"job", "instance"})
#: What each of Grafana's own variables stands for when an expression is checked.
GRAFANA_VARIABLES = {"__range": "7d", "__rate_interval": "5m", "__interval": "1m"}


# -- the code's metrics, through statsd_exporter ----------------------------------------

def plain_metrics() -> list[Metric]:
    """Every metric the code sends under its plain name: a finished job's (one that
    failed of two causes; the other causes are sent as zeros), every emitter counter, and
    a running job's rolling windows."""
    spec = JobSpec(failures=(InjectedFailure(at_step=30, cause="infra"),
                             InjectedFailure(at_step=60, cause="preemption")), world_size=8)
    events = simulate(spec)
    job = job_metrics(attribute_job(events).summary())
    counters = emitter_counter_metrics(EmitterStats(*range(1, 9)))
    assert {m.name.removeprefix("ett.emitter.") for m in counters} == set(EMITTER_COUNTERS)
    # the same job while it ran (its first half of events): what its train task sends
    mid = (events[0].ts + events[-1].ts) / 2
    running = attribute_job([e for e in events if e.ts <= mid], now=mid)
    windows = window_metrics(running, (5, 60))
    assert windows
    return job + counters + windows


def code_metrics() -> list[Metric]:
    """`plain_metrics` and, as on plain StatsD, the job metrics' copies with the tags in
    the name."""
    plain = plain_metrics()
    return plain + with_tags_in_names(plain)


@dataclass
class Series:
    """A Prometheus metric name as statsd_exporter exposes it."""

    cumulative: bool  # a counter, or a summary's or histogram's _sum, _count, _bucket
    labels: dict[str, set[str]] = field(default_factory=dict)  # label -> values seen


def _glob(match: str) -> re.Pattern[str]:
    return re.compile(r"\.".join("([^.]+)" if part == "*" else re.escape(part)
                                 for part in match.split(".")))


def _fill(template: str, groups: tuple[str, ...]) -> str:
    return re.sub(r"\$\{?(\d+)\}?", lambda m: groups[int(m.group(1)) - 1], template)


def exposed(metrics: list[Metric], rules: list[dict[str, Any]]) -> dict[str, Series]:
    """The series statsd_exporter makes of `metrics` under `rules`. A metric no rule
    matches fails: the exporter would name it from its dots, with the tags of a named
    copy in the name (a series per DAG and no labels)."""
    out: dict[str, Series] = {}

    def add(name: str, cumulative: bool, labels: dict[str, str]) -> None:
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name), name
        series = out.setdefault(name, Series(cumulative, {k: set() for k in labels}))
        # statsd_exporter refuses a name seen with another type or other label names
        assert series.cumulative == cumulative and set(series.labels) == set(labels), name
        for key, value in labels.items():
            series.labels[key].add(value)

    for metric in metrics:
        statsd = f"{STATSD_PREFIX}.{metric.name}"
        found = next(((rule, m) for rule in rules
                      if (m := _glob(rule["match"]).fullmatch(statsd))), None)
        assert found is not None, f"no statsd_exporter rule maps {statsd}"
        rule, match = found
        name = _fill(rule["name"], match.groups())
        labels = {k: _fill(v, match.groups()) for k, v in rule.get("labels", {}).items()}
        if metric.kind == "gauge":
            add(name, False, labels)
        elif metric.kind == "incr":
            add(name, True, labels)
        else:
            add(f"{name}_sum", True, labels)
            add(f"{name}_count", True, labels)
            if rule.get("observer_type") == "histogram":
                add(f"{name}_bucket", True, {**labels, "le": "+Inf"})
            else:
                add(name, False, {**labels, "quantile": "0.5"})
    return out


def mapping_rules() -> list[dict[str, Any]]:
    rules = yaml.safe_load(MAPPINGS.read_text())["mappings"]
    assert isinstance(rules, list) and rules
    return rules


# -- PromQL: the selectors of an expression --------------------------------------------

@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)
    ranged: bool  # followed by a range: `name{...}[5m]`


@dataclass(frozen=True)
class Query:
    selectors: tuple[Selector, ...]
    grouping: frozenset[str]  # labels of by/without/on/ignoring/group_left/group_right


# Names that are PromQL's own, never a metric: aggregations (`sum by (x) (...)` puts no
# parenthesis right after the name), binary and grouping keywords, and literals.
_KEYWORDS = frozenset({
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio", "by", "without", "on",
    "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "atan2", "inf", "nan"})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_NAME = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)\s*(\{[^{}]*\})?\s*(\[)?")
_MATCHER = re.compile(r'\s*([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"(\d+)"\s*(?:,|$)')


def parse_query(expr: str) -> Query:
    """The metric selectors and grouping labels of a PromQL expression whose variables
    are substituted. Anything this cannot read (a selector without a name, `__name__`, a
    matcher it cannot parse) fails rather than pass unchecked."""
    strings: list[str] = []

    def keep(m: re.Match[str]) -> str:
        strings.append(json.loads(m.group(0)) if m.group(0)[0] == '"' else m.group(0)[1:-1])
        return f'"{len(strings) - 1}"'

    text = _STRING.sub(keep, expr)
    assert "$" not in text, f"an unsubstituted variable in {expr!r}"
    grouping = {label.strip() for m in _GROUPING.finditer(text)
                for label in m.group(2).split(",") if label.strip()}
    text = _GROUPING.sub(lambda m: m.group(1), text)
    selectors = []
    for m in _NAME.finditer(text):
        name, braces, ranged = m.groups()
        after = text[m.end():].lstrip() if not braces and not ranged else ""
        if name in _KEYWORDS or (not braces and not ranged and after.startswith("(")):
            continue  # a keyword, or a function's name
        matchers = []
        body = braces[1:-1] if braces else ""
        for part in filter(str.strip, body.split(",")):
            one = _MATCHER.fullmatch(part + ",")
            assert one, f"cannot read the matcher {part!r} in {expr!r}"
            matchers.append((one.group(1), one.group(2), strings[int(one.group(3))]))
        selectors.append(Selector(name, tuple(matchers), ranged is not None))
    no_name = re.sub(r"[A-Za-z_:][\w:]*\s*\{[^{}]*\}", "", text)
    assert "{" not in no_name, f"a selector without a metric name in {expr!r}"
    assert all(label != "__name__" for s in selectors for label, _, _ in s.matchers), expr
    return Query(tuple(selectors), frozenset(grouping))


def substitute(expr: str, variables: dict[str, str]) -> str:
    """`expr` with `$x`, `${x}` and `[[x]]` replaced by the values checked."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        assert name in variables, f"unknown variable ${name} in {expr!r}"
        return variables[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]", value, expr)


# -- the dashboard ----------------------------------------------------------------------

def load_dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def variable_values(dashboard: dict[str, Any]) -> dict[str, str]:
    """Each template variable as an expression is checked with it: its default (a
    textbox, a custom list), `.*` for a query variable's All, the `prometheus` type for a
    datasource; plus Grafana's built-in interval variables."""
    out = dict(GRAFANA_VARIABLES)
    for var in dashboard["templating"]["list"]:
        kind, name = var["type"], var["name"]
        if kind == "datasource":
            out[name] = var["query"]
        elif kind == "query":
            out[name] = var["allValue"]
        else:
            out[name] = var["current"]["value"]
    return out


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str, bool]]:
    """(where, PromQL, whether it reads values) of every panel target and query variable,
    variables substituted. A query variable's `label_values(selector, label)` gives the
    selector, its label as a grouping label; it reads label values only."""
    values = variable_values(dashboard)
    for panel in all_panels(dashboard):
        for target in panel.get("targets", []):
            yield (f"panel {panel['title']!r} {target['refId']}",
                   substitute(target["expr"], values), True)
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        assert query == var.get("definition", query)
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", substitute(query, values))
        assert m, f"variable {var['name']}: only label_values(selector, label) is read"
        yield f"variable {var['name']}", f"sum by ({m.group(2)}) ({m.group(1)})", False


def problems(dashboard: dict[str, Any], series: dict[str, Series]) -> list[str]:
    """What in the dashboard's queries no exposed series backs; empty when all is."""
    found = []
    for where, expr, reads_values in expressions(dashboard):
        query = parse_query(expr)
        if not query.selectors:
            found.append(f"{where}: selects no metric: {expr}")
        known: set[str] = set(TARGET_LABELS)
        for sel in query.selectors:
            got = series.get(sel.name)
            if got is None:
                found.append(f"{where}: {sel.name} is not a series the code makes")
                continue
            known |= set(got.labels)
            if reads_values and got.cumulative and not sel.ranged:
                found.append(f"{where}: {sel.name} is cumulative; read it through a range")
            for label, op, value in sel.matchers:
                if label in TARGET_LABELS:
                    continue
                if label not in got.labels:
                    found.append(f"{where}: {sel.name} has no label {label}")
                elif op in ("=", "!=") and value not in got.labels[label]:
                    found.append(f"{where}: {sel.name}{{{label}}} is never {value!r}")
        found += [f"{where}: no series it reads has the label {label}"
                  for label in sorted(query.grouping - known)]
    return found


# -- the tests --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def series() -> dict[str, Series]:
    return exposed(code_metrics(), mapping_rules())


def test_the_dashboard_has_grafana_s_shape() -> None:
    d = load_dashboard()
    assert isinstance(d["schemaVersion"], int) and d["schemaVersion"] >= 36
    assert d["title"] and d["uid"] and d["time"]["from"]
    panels = list(all_panels(d))
    assert len(panels) >= 10
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for panel in panels:
        assert panel["type"] and panel["title"] and panel["description"], panel["id"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for where in [panel, *panel["targets"]]:
            assert where["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    names = [v["name"] for v in d["templating"]["list"]]
    assert len(names) == len(set(names)) and "datasource" in names
    # no two panels overlap on the grid
    cells = [(p["title"], x, y) for p in panels for x in range(p["gridPos"]["x"],
             p["gridPos"]["x"] + p["gridPos"]["w"]) for y in range(p["gridPos"]["y"],
             p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len({(x, y) for _, x, y in cells}) == len(cells)


def test_the_dashboard_has_the_panels_the_fleet_needs() -> None:
    """Fleet ETT% trend, Level-2 shares, NoF by cause, TTS and TTR percentiles, emitter
    health: each asked for by the series it must read."""
    exprs = [expr for _, expr, _ in expressions(load_dashboard())]

    def reads(*names: str) -> bool:
        return any(all(n in {s.name for s in parse_query(e).selectors} for n in names)
                   for e in exprs)

    assert reads("airflow_ett_fleet_gpu_effective_sum", "airflow_ett_fleet_gpu_e2e_sum")
    assert reads("airflow_ett_fleet_gpu_component_sum", "airflow_ett_fleet_gpu_e2e_sum")
    assert any("by (component)" in e for e in exprs)
    assert any("by (cause)" in e and "airflow_ett_fleet_nof" in e for e in exprs)
    for timing in ("tts", "ttr"):
        assert reads(f"airflow_ett_fleet_{timing}_bucket")
    assert all(reads(f"airflow_ett_emitter_{name}") for name in EMITTER_COUNTERS)


def test_every_query_reads_series_the_code_sends(series: dict[str, Series]) -> None:
    assert problems(load_dashboard(), series) == []


def test_the_mapping_gives_the_components_and_causes_as_labels(
        series: dict[str, Series]) -> None:
    assert series["airflow_ett_fleet_gpu_component_sum"].labels == {
        "component": set(COMPONENTS)}
    assert series["airflow_ett_fleet_nof"].labels["cause"] == {
        "preemption", "infra", "application", "unknown", "total"}
    assert set(series["airflow_ett_job_gpu_component_sum"].labels) == {
        "component", "tenant", "model", "dag_id"}
    assert set(series["airflow_ett_job_ett_pct"].labels) == {"tenant", "model", "dag_id"}
    assert "airflow_ett_fleet_tts" not in series  # a histogram: _bucket, no quantiles
    assert "airflow_ett_fleet_e2e" in series  # a summary (the exporter's default)


def test_the_extractor_finds_every_metric_and_skips_promql_s_own_words() -> None:
    q = parse_query('100 * sum by (component) (increase(a_sum{component!="x",job=~"j"}[1d]))'
                    ' / on() group_left() sum(rate(b_total[5m])) or vector(0)'
                    ' - histogram_quantile(0.9, sum by (le) (increase(c_bucket[1h])))'
                    ' + max without (dag_id) (d_gauge) * 1e3')
    assert [(s.name, s.ranged) for s in q.selectors] == [
        ("a_sum", True), ("b_total", True), ("c_bucket", True), ("d_gauge", False)]
    assert q.selectors[0].matchers == (("component", "!=", "x"), ("job", "=~", "j"))
    assert q.grouping == {"component", "le", "dag_id"}
    for bad in ('{__name__="x"}', 'sum(rate({job="x"}[5m]))', 'x{a=b}'):
        with pytest.raises(AssertionError):
            parse_query(bad)
    with pytest.raises(AssertionError, match="unknown variable"):
        substitute("x[$nope]", {})


def test_a_panel_that_queries_what_the_code_does_not_send_is_found(
        series: dict[str, Series]) -> None:
    d = load_dashboard()
    bad = copy.deepcopy(d)
    panel = copy.deepcopy(d["panels"][0])
    panel["id"] = 999
    panel["targets"] = [
        {"refId": "A", "expr": "sum(increase(${prefix}_fleet_gpu_wasted_sum[$window]))"},
        {"refId": "B", "expr": "sum(increase(${prefix}_fleet_e2e_bucket[$window]))"},
        {"refId": "C", "expr": 'sum(increase(${prefix}_fleet_nof{cause="oom"}[1d]))'},
        {"refId": "D", "expr": 'sum(increase(${prefix}_fleet_nof{tenant="a"}[1d]))'},
        {"refId": "E", "expr": "sum(${prefix}_emitter_sent)"},
        {"refId": "F", "expr": "sum by (tenant) (${prefix}_fleet_ett_pct)"},
    ]
    bad["panels"].append(panel)
    found = problems(bad, series)
    title = panel["title"]
    assert found == [
        f"panel {title!r} A: airflow_ett_fleet_gpu_wasted_sum is not a series the code makes",
        f"panel {title!r} B: airflow_ett_fleet_e2e_bucket is not a series the code makes",
        f"panel {title!r} C: airflow_ett_fleet_nof{{cause}} is never 'oom'",
        f"panel {title!r} D: airflow_ett_fleet_nof has no label tenant",
        f"panel {title!r} E: airflow_ett_emitter_sent is cumulative; read it through a range",
        f"panel {title!r} F: no series it reads has the label tenant",
    ]
    # and a mapping that loses a rule leaves a code metric unmapped
    rules = [r for r in mapping_rules() if r["match"] != "airflow.ett.job.gpu_component.*"]
    with pytest.raises(AssertionError, match="no statsd_exporter rule maps"):
        exposed(code_metrics(), rules)


def documented_names() -> set[str]:
    """The `ett.job.*` and `ett.emitter.*` names of docs/metrics.md's tables, a
    placeholder (`<cause>`) expanded to the values its row names in backquotes."""
    out: set[str] = set()
    for line in METRICS_DOC.read_text().splitlines():
        m = re.match(r"\| `(ett\.(?:job|emitter)\.[^`]+)` \|", line)
        if not m:
            continue
        name = m.group(1)
        hole = re.search(r"<(\w+)>", name)
        if hole is None:
            out.add(name)
            continue
        last = line.rstrip().rstrip("|").rsplit("|", 1)[1]
        values = re.findall(r"`(\w+)`", last)
        assert values, f"{name}: its row names no values for <{hole.group(1)}>"
        out |= {name.replace(hole.group(0), v) for v in values}
    return out


def test_docs_name_exactly_the_metrics_the_code_sends() -> None:
    sent = {m.name for m in plain_metrics()}
    assert documented_names() == {n for n in sent if not n.startswith("ett.window.")}
    # the rolling windows' rows have two holes: <N> (any window) and <component>
    rows = [re.escape(m.group(1)).replace(re.escape("<N>"), r"\d+").replace(
                re.escape("<component>"), "(?:" + "|".join(COMPONENTS) + ")")
            for m in re.finditer(r"^\| `(ett\.window\.[^`]+)` \|", METRICS_DOC.read_text(),
                                 re.MULTILINE)]
    windows = {n for n in sent if n.startswith("ett.window.")}
    assert rows and windows
    assert {n for n in windows if not any(re.fullmatch(r, n) for r in rows)} == set()
    assert [r for r in rows if not any(re.fullmatch(r, n) for n in windows)] == []


def test_docs_mapping_table_names_series_the_mapping_makes(series: dict[str, Series]) -> None:
    """The statsd_exporter column of docs/metrics.md's naming table."""
    text = METRICS_DOC.read_text()
    section = text[text.index("## Grafana dashboard"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("| `airflow.ett.")]
    assert len(rows) >= 5
    for row in rows:
        cell = row.split("|")[3]
        names = re.findall(r"`(airflow_ett_\w+)(?:\{[^`]*\})?`", cell)
        assert names, row
        for name in names:
            assert name in series, f"docs name {name}, which the mapping does not make"
