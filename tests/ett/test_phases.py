from __future__ import annotations

import pytest

from airflow_ett.ett.phases import COMPONENTS, PHASES, TTR_STAGES, component_of, ttr_stage


def test_registered_phase_keeps_its_component() -> None:
    assert component_of("checkpoint_restore") == "initialization"
    # a declaration never moves a registered phase (the event parser rejects conflicts)
    assert component_of("data_wait", "effective_training") == "wasted_training"


def test_unregistered_phase_uses_its_declared_component() -> None:
    assert component_of("my_custom_warmup", "compilation") == "compilation"


def test_unregistered_undeclared_phase_is_a_key_error_naming_it() -> None:
    with pytest.raises(KeyError) as info:
        component_of("my_custom_warmup")
    assert info.value.args == ("my_custom_warmup",)


@pytest.mark.parametrize(
    ("phase", "stage"),
    [
        ("detection", "detection"),
        ("checkpoint_restore", "restore"),  # initialization, but its own TTR stage
        ("failed_attempt_shutdown", "shutdown"),
        ("rescheduling", "rescheduling"),
        ("retry_delay", "rescheduling"),
        ("process_group_init", "startup"),
        ("cache_load", "startup"),
        ("replay", "replay"),
        ("data_wait", "replay"),
    ],
)
def test_ttr_stage_of_registered_phases(phase: str, stage: str) -> None:
    assert ttr_stage(phase, PHASES[phase].component) == stage


def test_every_phase_has_a_component_and_a_ttr_stage() -> None:
    for name, phase in PHASES.items():
        assert phase.name == name
        assert phase.component in COMPONENTS
        assert ttr_stage(name, phase.component) in TTR_STAGES
