"""Stage 7, Level 2: the final timeline summed per label and per component.

Guarantees: `phases_us` and `components_us` each sum to the timeline's length (E2E) to the
microsecond, every one of the six components is present (zero if unused), and
`phase_components` names the component of every label on the timeline or reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_ett.ett.attribution.explicit import ExplicitPhases
from airflow_ett.ett.phases import COMPONENTS, PHASES
from airflow_ett.ett.timeline import Timeline


@dataclass(frozen=True, slots=True)
class Level2:
    phases_us: dict[str, int]
    components_us: dict[str, int]
    phase_components: dict[str, str]


def level2(timeline: Timeline, explicit: ExplicitPhases) -> Level2:
    phase_components = dict(explicit.label_component)
    for label in timeline.labels:
        if label not in phase_components:
            phase_components[label] = PHASES[label].component  # an implied label
    phases_us = timeline.totals()
    components_us = dict.fromkeys(COMPONENTS, 0)
    for label, us in phases_us.items():
        components_us[phase_components[label]] += us
    return Level2(phases_us, components_us, phase_components)
