"""The JSON form of the pages' figures: what `/ett/api/v1/...` returns, what the HTML pages
render, and (through FastAPI) the OpenAPI schema at `/ett/openapi.json`.

Pydantic models, because FastAPI turns them into the schema; they mirror the rollup's and
the summary's msgspec structs field for field where they carry one
(tests/plugin/web/test_models.py fails when a struct gains a field the API does not carry),
so a name means the same thing in the store, the report's JSON and this API. Times are
Unix seconds, durations seconds, shares and ETT% percent (0-100), GPU time GPU-hours.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the fleet ----------------------------------------------------------------------------

class Group(_Model):
    """One group's figures for one day (the fleet, a tenant, a model): `GroupFigures`."""

    jobs: int
    provisional_jobs: int
    e2e_s: float = Field(description="seconds summed over the jobs (not GPU-weighted)")
    effective_s: float
    ett_pct: float | None = Field(description="GPU-seconds of effective training over "
                                              "GPU-seconds of E2E; None: no GPU time")
    components_s: dict[str, float]
    shares_pct: dict[str, float | None] = Field(description="each component's share of the "
                                                            "GPU time; None: no GPU time")
    gpu_hours: float
    gpu_hours_lost: float
    gpu_hours_lost_by_component: dict[str, float]
    tts_p50_s: float | None
    tts_p90_s: float | None
    ttr_p50_s: float | None
    ttr_p90_s: float | None
    nof: dict[str, int]
    attempts: int
    attempts_per_job: float
    failures_per_attempt: float
    failures_per_attempt_without_preemption: float
    gpu_hours_lost_to_slow_steps: float | None = Field(
        None, description="GPU-hours of effective training lost to steps slower than each "
                          "job's ideal step time (inside effective training: not in "
                          "gpu_hours_lost); None: a day stored before the figure")
    slow_steps_pct_of_effective: float | None = Field(
        None, description="gpu_hours_lost_to_slow_steps over the effective GPU time, "
                          "percent; None: no effective GPU time, or a day stored before "
                          "the figure")


class Team(_Model):
    team: str
    components: list[str]
    share_pct: float | None
    gpu_hours_lost: float
    breaches: list[str]


class Slo(_Model):
    component: str
    owner: str
    target: str
    share_pct: float | None
    gpu_hours_lost: float
    status: Literal["ok", "breach", "none"]
    max_share_pct: float | None = None
    min_share_pct: float | None = None


class WhatIf(_Model):
    kind: Literal["cut", "faster_start"]
    component: str
    amount: float = Field(description="percent for `cut`, seconds per start for "
                                      "`faster_start`")
    label: str
    ett_pct_before: float
    ett_pct_after: float
    gain_pts: float
    e2e_s_saved: float
    gpu_hours_saved: float


class RunLoss(_Model):
    """One of the day's worst runs (most GPU-hours lost first)."""

    job: str
    tenant: str
    model: str
    dag_id: str | None
    run_id: str | None
    gpus: int
    gpu_hours: float
    gpu_hours_lost: float
    ett_pct: float
    worst_component: str
    provisional: bool
    href: str | None = Field(description="the run page, relative to /ett/ (None for a job "
                                         "that is no DAG run)")


class DayPoint(_Model):
    """One day of the trend."""

    day: str
    jobs: int
    ett_pct: float | None = Field(description="None for a day without GPU time (no job)")
    gpu_hours: float
    gpu_hours_lost: float
    gpu_hours_lost_to_slow_steps: float | None = Field(
        None, description="inside effective training (Group's); None: stored before it")
    provisional: bool
    synthetic_jobs: int
    computed_at: float


class Day(_Model):
    """The last day shown, in full."""

    day: str
    tz: str
    lo: float
    hi: float
    computed_at: float
    provisional: bool
    synthetic_jobs: int
    components_file: str
    previous_day: str | None = Field(description="the day shown before it, if any")
    ett_pct_change: float | None = Field(description="fleet ETT% minus previous_day's")
    fleet: Group
    slo: list[Slo]
    teams: list[Team]
    tenants: dict[str, Group]
    models: dict[str, Group]
    what_if: list[WhatIf] = Field(description="largest gain first")
    top_runs: list[RunLoss]
    silent_jobs: int = Field(0, description="jobs not ended and silent past silent_after_s, "
                                            "counted only up to that long after their last "
                                            "event")
    silent_after_s: float = Field(0.0, description="[ett] rollup_silent_after_s of the "
                                                   "rollup (0: no bound)")


class Scope(_Model):
    """The DAGs the figures are computed over: all of them, or those the user may read."""

    all_dags: bool
    readable_dags: int | None = Field(description="how many DAGs, when not all")


class Fleet(_Model):
    first: str
    last: str
    scope: Scope
    days: list[DayPoint]
    latest: Day | None = Field(description="the day the headline shows: the last day in "
                                           "[first, last] with a rollup, passing over days "
                                           "where no job had finished (all still running)")
    notes: list[str]
    figures: dict[str, dict[str, Any]] | None = Field(
        default=None, description="plotly figure specs (with ?figures=true): ett_trend, "
                                  "shares, lost_by_team, failures")


# -- one run ------------------------------------------------------------------------------

class Attempt(_Model):
    attempt: str
    start: float
    end: float
    status: str
    cause: str | None
    exit_code: int | None
    inferred: bool
    effective_s: float
    message: str | None = Field(None, description="what the attempt's end said: a "
                                                 "failure's message, a preemption's reason")


class Failure(_Model):
    attempt: str
    cause: str
    at: float
    during_tts: bool
    ttr_s: float | None
    detection_s: float
    ttr_from_detection_s: float | None


class Level1(_Model):
    tts_s: float
    started: bool = Field(description="an effective step happened (TTS is final)")
    ttr_s: list[float]
    nof: dict[str, int]
    attempts: int
    failures_per_attempt: float
    failures_per_attempt_without_preemption: float
    csbt_s: float
    checkpoint_saves: int
    shutdown_s: float
    in_loop_waste_s: float
    model_available_after_release_s: float | None


class SlowSteps(_Model):
    """Level 3 inside effective training (`JobSummary.slow_steps`): the run's ideal step
    time and the effective time lost to steps slower than it."""

    ideal_step_s: float
    lost_s: float
    lost_pct_of_effective: float
    spans: int
    slow_spans: int = Field(description="progress spans over 10% slower than the ideal")


class RankStepTime(_Model):
    """One rank's own step time (its step less its wait for the other ranks)."""

    rank: int
    step_s: float = Field(description="steps-weighted median of its steady reports")
    wait_step_s: float = Field(description="its mean wait per step for the other ranks")
    steps: int


class Straggler(_Model):
    """The rank of an attempt the other ranks consistently waited for."""

    attempt: str
    rank: int
    step_s: float
    others_step_s: float = Field(description="the median of the other ranks' step times")
    slowdown: float | None
    slow_share: float = Field(description="of its steady steps, the share over 10% slower")
    lost_s: float = Field(description="wall time the job spent waiting for it")


class RankSteps(_Model):
    """Per rank (`JobSummary.rank_steps`): each rank's own step time, each straggler."""

    ranks: list[RankStepTime]
    stragglers: list[Straggler]


class Component(_Model):
    component: str
    seconds: float
    share_pct: float


class Phase(_Model):
    phase: str
    component: str
    seconds: float
    share_pct: float


class Window(_Model):
    """One rolling window of a run still going: its last `minutes` up to its end so far
    (`hi`: the run's `ended_at`, which is `now` to the microsecond; `last_windows`). The
    components add up to `e2e_s`, the run's time in the window: `minutes * 60`, or less
    for a run younger than that."""

    minutes: int
    lo: float
    hi: float
    e2e_s: float
    ett_pct: float
    components_s: dict[str, float]


class Published(_Model):
    ts: float
    uri: str | None


class Bar(_Model):
    row: str
    start_s: float
    end_s: float
    phase: str
    component: str


class FailureMark(_Model):
    attempt: str
    at_s: float
    cause: str


class Timeline(_Model):
    """One row per attempt (`scheduling`: the time outside every attempt), seconds since
    the submission."""

    rows: list[str]
    bars: list[Bar]
    failures: list[FailureMark]


class Flag(_Model):
    """Something a person should know about the run (`ett.flags.JobFlag`): a job late to
    start, flagged when its tenant's time-to-start bound passed while it still waited."""

    kind: str
    at: float
    message: str
    bound_s: float
    waited_s: float


class Run(_Model):
    job: str
    dag_id: str
    run_id: str
    tenant: str
    model: str
    provisional: bool = Field(description="still running: the figures grow with `now`")
    synthetic: bool
    world_size: int
    submitted_at: float
    ended_at: float
    now: float = Field(description="when these figures were computed")
    ett_pct: float
    e2e_s: float
    effective_s: float
    windows: list[Window] = Field(description="a run still going: its rolling windows "
                                              "([ett] rolling_windows), shortest first; "
                                              "none for a finished run")
    level1: Level1
    level2: list[Component]
    phases: list[Phase] = Field(description="largest first")
    attempts: list[Attempt]
    failures: list[Failure]
    published: list[Published]
    timeline: Timeline
    warnings: list[str]
    slow_steps: SlowSteps | None = Field(
        default=None, description="Level 3 inside effective training; none before an "
                                  "effective step")
    rank_steps: RankSteps | None = Field(
        default=None, description="each rank's own step time and each attempt's straggler; "
                                  "none when no rank reported step times")
    flags: list[Flag] = Field(default_factory=list,
                              description="raised while it ran (a late start), oldest first")
    figures: dict[str, dict[str, Any]] | None = Field(
        default=None, description="plotly figure specs (with ?figures=true): timeline")
