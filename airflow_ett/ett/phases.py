"""The Level-2 components and the registry of Level-3 phases that feed them.

Every second of a job's wall time lands in exactly one of the six components. A phase is
the finer (Level-3) name a trainer, operator or listener reports; the registry says which
component owns it, so that a phase name alone is enough to attribute its time. Trainers
that bring their own phase names declare the component on the event instead.

Some names are *derived*: the attribution computes them from the shape of the timeline
(queue time, gaps between attempts, replayed steps...). Reporting them explicitly would
double count, so events may not use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

COMPONENTS: Final = (
    "scheduling",
    "initialization",
    "compilation",
    "effective_training",
    "wasted_training",
    "shutdown",
)
"""The six Level-2 components, in report order."""

SCHEDULING, INITIALIZATION, COMPILATION, EFFECTIVE, WASTED, SHUTDOWN = COMPONENTS


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    component: str
    derived: bool
    description: str


_REGISTRY: Final[tuple[Phase, ...]] = (
    # scheduling: waiting for an allocation
    Phase("queued", SCHEDULING, True, "submission -> first attempt starts"),
    Phase("rescheduling", SCHEDULING, True, "an attempt ended -> the next one starts"),
    Phase("pool_wait", SCHEDULING, False, "waiting for a pool slot or GPU quota"),
    Phase("retry_delay", SCHEDULING, False, "Airflow retry delay before the next try"),
    Phase("preemption_wait", SCHEDULING, False, "preempted, waiting to be placed again"),
    # initialization: everything the trainer does before it can step
    Phase("hardware_setup", INITIALIZATION, False, "device discovery and setup"),
    Phase("process_group_init", INITIALIZATION, False, "torch.distributed rendezvous"),
    Phase("launcher_init", INITIALIZATION, False, "torchrun / process launch"),
    Phase("trainer_init", INITIALIZATION, False, "trainer imports and configuration"),
    Phase("data_pipeline_init", INITIALIZATION, False, "data pipeline workers start"),
    Phase("model_creation", INITIALIZATION, False, "model build and sharding"),
    Phase("checkpoint_restore", INITIALIZATION, False, "find and load the newest checkpoint"),
    Phase("first_batch", INITIALIZATION, False, "waiting for the first real batch"),
    Phase("startup_other", INITIALIZATION, True, "startup time inside an attempt no phase claims"),
    # compilation: PT2 and its caches
    Phase("compile", COMPILATION, False, "torch.compile, all stages"),
    Phase("compile_dynamo", COMPILATION, False, "graph capture"),
    Phase("compile_aot", COMPILATION, False, "AOT autograd"),
    Phase("compile_inductor", COMPILATION, False, "inductor code generation and build"),
    Phase("autotune", COMPILATION, False, "kernel autotuning"),
    Phase("cache_prewarm", COMPILATION, False, "compile-cache prewarm before the GPU task"),
    Phase("cache_load", COMPILATION, False, "fetch and load compile-cache artifacts"),
    # effective training
    Phase("effective_steps", EFFECTIVE, True, "steps moving the cursor past its high-water mark"),
    # wasted training: in the loop, but no new data
    Phase("replay", WASTED, True, "steps that re-read data already consumed"),
    Phase("checkpoint_save_blocking", WASTED, False, "the train loop blocked by a checkpoint save"),
    Phase("data_wait", WASTED, False, "the train loop waiting for a batch"),
    Phase("stall", WASTED, False, "any other pause in the train loop"),
    Phase("loop_gap", WASTED, True, "time between steps no phase claims"),
    Phase("detection", WASTED, True, "last progress of a failed attempt -> failure detected"),
    # shutdown: until the GPUs are released
    Phase("final_checkpoint", SHUTDOWN, False, "the last checkpoint after the last step"),
    Phase("teardown", SHUTDOWN, False, "process-group destroy, workers stop, exit"),
    Phase("publish_in_gpu", SHUTDOWN, False, "publishing the model while still holding GPUs"),
    Phase("shutdown_other", SHUTDOWN, True, "after a finished attempt's last step, unclaimed"),
    Phase("failed_attempt_shutdown", SHUTDOWN, True, "failure detected -> failed attempt gone"),
    Phase("gpu_release", SHUTDOWN, True, "last attempt ended -> the job released its GPUs"),
)

PHASES: Final[dict[str, Phase]] = {p.name: p for p in _REGISTRY}
PHASE_ORDER: Final[dict[str, int]] = {p.name: i for i, p in enumerate(_REGISTRY)}
COMPONENT_ORDER: Final[dict[str, int]] = {c: i for i, c in enumerate(COMPONENTS)}

# TTR's Level-3 stages, in the order DESIGN names them; each phase falls in one.
TTR_STAGES: Final = ("detection", "shutdown", "rescheduling", "startup", "restore", "replay")


def ttr_stage(phase: str, component: str) -> str:
    """Which stage of a recovery a phase's time belongs to (DESIGN section 1, TTR_i)."""
    if phase == "detection":
        return "detection"
    if phase == "checkpoint_restore":
        return "restore"
    if component == SHUTDOWN:
        return "shutdown"
    if component == SCHEDULING:
        return "rescheduling"
    if component in (INITIALIZATION, COMPILATION):
        return "startup"
    return "replay"  # replay steps and any other in-loop waste before the next new data


def component_of(phase: str, declared: str | None = None) -> str:
    """The component a phase's time goes to.

    A registered phase keeps its registered component (a conflicting declaration is a
    validation error raised by the event parser, not here); an unregistered phase needs a
    declared component.
    """
    known = PHASES.get(phase)
    if known is not None:
        return known.component
    if declared is None:
        raise KeyError(phase)
    return declared
