from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_ett.ett.phases import COMPONENTS
from airflow_ett.rollup.components import (
    UNOWNED,
    ComponentPolicy,
    ComponentsError,
    load_components,
    parse_components,
)
from tests.hostile import HOSTILE_TOML, in_thread


def test_the_bundled_file_owns_every_component() -> None:
    config = load_components()
    assert list(config.policies) == list(COMPONENTS)
    assert config.owner("initialization") == "trainer-team"
    assert config.policies["initialization"].target == "<1%"
    assert config.policies["effective_training"].target == ">=90%"
    assert config.teams()["pt2-team"] == ("compilation",)
    assert load_components("").source == config.source  # empty setting: the default


def test_a_partial_file_leaves_the_rest_unowned_without_slo(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[components.shutdown]\nowner = "pub"\nmax_share_pct = 2\n'
                 '[components.compilation]\nowner = "pub"\n')
    config = load_components(f)
    assert config.teams() == {UNOWNED: ("scheduling", "initialization", "effective_training",
                                        "wasted_training"), "pub": ("compilation", "shutdown")}
    assert config.policies["compilation"].status(50.0) == "none"
    assert config.source == str(f)


@pytest.mark.parametrize(("policy", "share", "status"), [
    (ComponentPolicy("initialization", "t", max_share_pct=1.0), 0.999, "ok"),
    (ComponentPolicy("initialization", "t", max_share_pct=1.0), 1.0, "breach"),  # "under 1%"
    (ComponentPolicy("effective_training", "t", min_share_pct=90.0), 90.0, "ok"),
    (ComponentPolicy("effective_training", "t", min_share_pct=90.0), 89.99, "breach"),
    (ComponentPolicy("shutdown", "t"), 99.0, "none"),
])
def test_slo_verdicts_at_the_bounds(policy: ComponentPolicy, share: float, status: str) -> None:
    assert policy.status(share) == status


@pytest.mark.parametrize(("raw", "message"), [
    ({"components": {"initialisation": {}}},
     "component 'initialisation': unknown component \\(known: scheduling,"),
    ({"components": {"shutdown": {"ownr": "x"}}},
     "component 'shutdown', field 'ownr': unknown field"),
    ({"components": {"shutdown": {"owner": ""}}},
     "component 'shutdown', field 'owner': '' is not a team name"),
    ({"components": {"shutdown": {"owner": 3}}},
     "component 'shutdown', field 'owner': 3 is not a team name"),
    ({"components": {"shutdown": {"max_share_pct": 101}}},
     "component 'shutdown', field 'max_share_pct': 101 is not a share in \\(0, 100\\]"),
    ({"components": {"shutdown": {"max_share_pct": 0}}},
     "component 'shutdown', field 'max_share_pct': 0 is not a share in \\(0, 100\\] "
     "\\(percent\\)$"),
    ({"components": {"shutdown": {"max_share_pct": -0.0}}},
     "component 'shutdown', field 'max_share_pct': -0.0 is not a share in \\(0, 100\\]"),
    ({"components": {"shutdown": {"max_share_pct": float("inf")}}},
     "component 'shutdown', field 'max_share_pct': inf is not a share in \\(0, 100\\]"),
    ({"components": {"effective_training": {"min_share_pct": 100.5}}},
     "component 'effective_training', field 'min_share_pct': 100.5 is not a share in "
     "\\[0, 100\\]"),
    ({"components": {"effective_training": {"min_share_pct": -1}}},
     "component 'effective_training', field 'min_share_pct': -1 is not a share in "
     "\\[0, 100\\]"),
    ({"components": {"shutdown": {"min_share_pct": "5%"}}},
     "component 'shutdown', field 'min_share_pct': '5%' is not a share"),
    ({"components": {"shutdown": {"max_share_pct": True}}},
     "component 'shutdown', field 'max_share_pct': True is not a share"),
    ({"components": {"shutdown": {"max_share_pct": float("nan")}}},
     "component 'shutdown', field 'max_share_pct': nan is not a share"),
    ({"components": {"shutdown": {"max_share_pct": 1, "min_share_pct": 0}}},
     "component 'shutdown': give max_share_pct or min_share_pct, not both"),
    ({"components": {"shutdown": "pub"}}, "component 'shutdown': must be a table, got 'pub'"),
    ({"components": []}, "'components' must be a table"),
    ({"teams": {}}, "unknown top-level key 'teams'"),
])
def test_bad_files_are_refused_naming_component_field_and_value(raw: dict,
                                                                message: str) -> None:
    with pytest.raises(ComponentsError, match=f"components file F: {message}"):
        parse_components(raw, source="F")


def test_unreadable_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ComponentsError, match=r"c\.toml: not found"):
        load_components(tmp_path / "c.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[components.shutdown\n")
    with pytest.raises(ComponentsError, match=r"bad\.toml: not valid TOML"):
        load_components(bad)


@pytest.mark.parametrize(("kind", "make"), HOSTILE_TOML)
def test_a_hostile_file_is_one_line_at_once(tmp_path: Path, kind: str, make: Any) -> None:
    """A FIFO or /dev/zero (which hung the rollup), 200 MB, not UTF-8, 5,000 levels deep
    (RecursionError): one line naming the file, at once."""
    f = tmp_path / "c.toml"
    says = make(f)
    with pytest.raises(ComponentsError) as err:
        in_thread(lambda: load_components(f))
    assert str(err.value).startswith(f"components file {f}: {says}"), err.value


@pytest.mark.parametrize("owner", ["pub\x00lishing", "pub\x1b[2J", "pub\u202egnihsil",
                                   "pub\u2066x", "pub\nlishing", "pub\tx", "pub\u200fx",
                                   "pub\x85", "pub\u2028x"])
def test_an_owner_with_a_control_or_format_character_is_refused(owner: str) -> None:
    """NUL was stored on SQLite and failed the PostgreSQL rollup; the others would drive
    the terminal of whoever reads the report. One rule, at load, for both backends."""
    with pytest.raises(ComponentsError) as refused:
        parse_components({"components": {"shutdown": {"owner": owner}}}, source="F")
    assert str(refused.value).startswith(
        f"components file F: component 'shutdown', field 'owner': {owner!r} is not a team "
        "name (it holds a control or format character)")


def test_a_nul_written_as_a_toml_escape_is_refused_at_load(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[components.shutdown]\nowner = "pub\\u0000lishing"\n')
    with pytest.raises(ComponentsError, match=r"field 'owner': 'pub\\x00lishing'"):
        load_components(f)


def test_printable_owners_of_any_script_and_brackets_are_kept() -> None:
    owners = {"shutdown": "Veröffentlichung 出版 [red]team[/red]", "compilation": "pt2 team"}
    config = parse_components({"components": {c: {"owner": o} for c, o in owners.items()}},
                              source="F")
    assert {c: config.owner(c) for c in owners} == owners
