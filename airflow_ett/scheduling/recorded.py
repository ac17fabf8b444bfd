"""A recorded fleet as the preemption simulation's arrivals: each stored job's summary
becomes a `fleet_sim.JobArrival`, so that a platform team can see what each policy would
have done on its own history (`airflow-ett simulate-preemption --from D1 --to D2`).

What is taken from a job's summary (`ett.summary.JobSummary`), and why:

- arrival: its submission; GPUs: its world size;
- work: its effective training seconds (new data: what it must train again if lost);
- startup: its first start without the queueing (the TTS phases outside `scheduling`),
  since the simulation queues jobs itself;
- checkpoints: one periodic save per `effective / periodic saves` seconds, each blocking
  the loop for its mean blocking time; the exit save a preempted job makes is its mean
  total save time (the graceful path waits for the whole save);
- failures: its recorded infra failures, spread evenly over its work (the simulation
  replays the same points under every policy).

Jobs of tenants the tenants file does not name, jobs that never trained, and jobs larger
than their tenant may ever hold (or than the fleet) are left out and counted, so the
output can say what it did not simulate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from airflow_ett.ett.phases import SCHEDULING
from airflow_ett.ett.summary import JobSummary
from airflow_ett.scheduling.fleet_sim import JobArrival
from airflow_ett.scheduling.model import TenantPolicy

#: A start no shorter than this (a summary whose TTS phases are all queueing).
MIN_STARTUP_S = 1.0


@dataclass
class Recorded:
    arrivals: list[JobArrival] = field(default_factory=list)
    unknown_tenants: dict[str, int] = field(default_factory=dict)
    not_started: int = 0
    too_big: int = 0  # more GPUs than its tenant may ever hold (or the fleet has)


def arrival_of(summary: JobSummary, policy: TenantPolicy) -> JobArrival:
    work = summary.effective_s
    startup = sum(seconds for phase, seconds in summary.tts_phases.items()
                  if summary.phase_components.get(phase) != SCHEDULING)
    ckpt = summary.checkpoints
    periodic = max(0, ckpt.saves - ckpt.final_saves)
    interval = work / periodic if periodic else work
    save = ckpt.blocking_s / ckpt.saves if ckpt.saves else 0.0
    exit_save = ckpt.total_s / ckpt.saves if ckpt.saves else None
    infra = summary.nof.get("infra", 0)
    failures = tuple(work * (i + 1) / (infra + 1) for i in range(infra))
    return JobArrival(job=summary.job, tenant=policy.name, priority=policy.priority,
                      gpus=max(1, summary.world_size),
                      arrival=summary.submitted_at, work_s=work,
                      startup_s=max(MIN_STARTUP_S, startup),
                      checkpoint_interval_s=max(1.0, interval), checkpoint_save_s=save,
                      failures_at_s=failures, exit_save_s=exit_save)


def recorded_arrivals(summaries: Iterable[JobSummary], tenants: Mapping[str, TenantPolicy],
                      capacity_gpus: int) -> Recorded:
    out = Recorded()
    for summary in summaries:
        policy = tenants.get(summary.tenant)
        if policy is None:
            out.unknown_tenants[summary.tenant] = out.unknown_tenants.get(summary.tenant, 0) + 1
            continue
        if summary.effective_s <= 0:
            out.not_started += 1
            continue
        if summary.world_size > min(policy.limit_gpus, capacity_gpus):
            out.too_big += 1
            continue
        out.arrivals.append(arrival_of(summary, policy))
    out.arrivals.sort(key=lambda a: (a.arrival, a.job))
    return out
