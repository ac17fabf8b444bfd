"""Preemption policies on simulated congested fleets (issues 11 and 22): GPU-hours lost to
preemption, high-priority first waits, fleet ETT% and preemptions per job under no
preemption, the classic Kueue-like order and our stage-aware rules, on the same workloads,
and the price of making a waiting job wait for a victim's checkpoint swept, per fleet.

    python bench/preemption.py                    # the three bench fleets, seeds 1-20
    python bench/preemption.py --fleet small-busy --seeds 1,2,3
    python bench/preemption.py --tenants my-tenants.toml [--gpus 96 --hours 24 --load 0.9
                                                          --work-scale 2 --high-priority 50]
    python bench/preemption.py --prices 0,0.5,2 --price 0.5 --grace-s 300

The fleets (`FLEETS`): `bundled` is the example tenants file as it is (4 tenants, 64 GPUs,
the synthetic fleet's job lengths, offered load 1.0); `small-busy` (3 tenants, 32 GPUs,
half-length jobs, load 1.2) and `large-calm` (6 tenants, 128 GPUs, double-length jobs,
load 0.8) are bench/fleets/*.toml. `--tenants FILE` runs any valid tenants file instead:
its GPUs are its `capacity_gpus` (else its quotas' sum), its load shares and jobs are
derived from it (`fleet_workload.derived_shares`), its high-priority jobs are those of its
top priority unless `--high-priority` says otherwise.

One run per fleet and seed, so that the policies compare like with like: one workload
(`fleet_workload.synthetic_arrivals`: the synthetic fleet's jobs, SYNTHETIC, their startup,
checkpoint and restart costs from `rollup/simulate.py`, Poisson arrivals offering the
load) simulated under each policy by `fleet_sim.simulate`, whose preempting policies call
`victims.choose`, the controller's own victim function, with the tenants file's
priorities, guarantees, borrowing, graces, minimum runs, daily caps and `resume_after_s`.
Stage-aware runs at the tenants file's `checkpoint_wait_price` (or `--price`) and at each
price of the sweep. Figures are pooled over the seeds: sums of GPU-hours, percentiles over
all the high-priority jobs of every seed (their first wait: arrival to first start; a job
not started by the end counts its wait so far). Twenty seeds by default: one seed's ratio
of lost GPU-hours swings by 2x either way, and the pooled high-priority p90 of ten seeds
moves by 10% with any change to the policy; the two halves of the seeds are printed for
the default price, as a measure of that noise. The runs go to `--jobs` processes.

Target (issue 22), on every fleet: stage-aware at the default price loses at most 0.5x
the classic policy's GPU-hours to preemption AND its high-priority p90 first wait is at
most 1.1x classic's. Where no price meets it, the output says which side stands in the
way and the best each side reaches.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from airflow_ett.scheduling.fleet_sim import (
    FleetSimError,
    JobArrival,
    Policy,
    PolicySummary,
    SimulationResult,
    simulate,
    summarise,
)
from airflow_ett.scheduling.fleet_workload import synthetic_arrivals
from airflow_ett.scheduling.model import MAX_WAIT_PRICE, TenantPolicy
from airflow_ett.scheduling.tenants import TenantsConfig, TenantsError, load_tenants

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_TENANTS = ROOT / "airflow_ett" / "scheduling" / "tenants.example.toml"
LOST_TARGET = 0.5
P90_TARGET = 1.1
DEFAULT_PRICES = (0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


@dataclasses.dataclass(frozen=True)
class Fleet:
    """A bench fleet: its tenants file, and how the workload is drawn for it."""

    name: str
    tenants: Path
    hours: float = 48.0
    load: float = 1.0
    work_scale: float = 1.0
    high_priority: int | None = None  # None: the file's top priority
    gpus: int | None = None  # None: the file's capacity_gpus, else its quotas' sum


FLEETS: dict[str, Fleet] = {
    "bundled": Fleet("bundled", EXAMPLE_TENANTS, high_priority=80),
    "small-busy": Fleet("small-busy", ROOT / "bench" / "fleets" / "small-busy.toml",
                        load=1.2, work_scale=0.5, high_priority=90),
    "large-calm": Fleet("large-calm", ROOT / "bench" / "fleets" / "large-calm.toml",
                        load=0.8, work_scale=2.0, high_priority=90),
}


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A fleet ready to run: its tenants (graces overridden if asked) and knobs."""

    fleet: Fleet
    config: TenantsConfig
    tenants: dict[str, TenantPolicy]
    gpus: int
    high_priority: int
    price: float


Run = tuple[str, Policy, float]  # fleet, policy, price


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        prepared = [_prepare(fleet, args) for fleet in _fleets(args)]
        seeds = _seeds(args.seeds)
        prices = _prices(args.prices)
    except (TenantsError, FleetSimError, ValueError) as exc:
        print(f"preemption.py: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    began = time.perf_counter()
    try:
        workloads, results = _run_all(prepared, seeds, prices, args.jobs)
    except FleetSimError as exc:
        print(f"preemption.py: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - began
    now = dt.datetime.now(dt.UTC)
    print(f"# preemption policies on simulated fleets, {now:%Y-%m-%d %H:%M} UTC, "
          f"{platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; seeds {_span(seeds)}")
    verdicts = []
    for p in prepared:
        verdicts.append(_report(p, seeds, prices, workloads[p.fleet.name], results))
    print(f"simulated {sum(len(r) for r in results.values())} runs in {seconds:.0f} s "
          f"({args.jobs} processes, workloads included)")
    _summary(prepared, prices, verdicts)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--fleet", choices=sorted(FLEETS), action="append",
                       help="a bench fleet (repeatable; default: all three)")
    which.add_argument("--tenants", type=Path, help="any valid tenants file, as one fleet")
    parser.add_argument("--gpus", type=int, help="the fleet's GPUs (with --tenants)")
    parser.add_argument("--hours", type=float, help="simulated hours (default 48)")
    parser.add_argument("--load", type=float,
                        help="offered load: GPU-seconds asked / (GPUs x hours)")
    parser.add_argument("--work-scale", type=float,
                        help="job lengths: the synthetic fleet's training times x this")
    parser.add_argument("--high-priority", type=int,
                        help="the jobs whose waits are reported: priority >= this")
    parser.add_argument("--seeds", default="1-20", help="comma-separated, or a range: 1-20")
    parser.add_argument("--price", type=float, default=None,
                        help="the default price (default: the tenants file's "
                             "[scheduling] checkpoint_wait_price)")
    parser.add_argument("--prices", default=",".join(f"{p:g}" for p in DEFAULT_PRICES),
                        help="the prices swept, comma-separated")
    parser.add_argument("--grace-s", type=float, default=None,
                        help="set every tenant's grace_s to this (default: the file's)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes to run the simulations in")
    return parser


def _fleets(args: argparse.Namespace) -> list[Fleet]:
    if args.tenants is None:
        fleets = [FLEETS[name] for name in dict.fromkeys(args.fleet or FLEETS)]
        overrides = {k: getattr(args, k) for k in ("gpus", "hours", "load", "work_scale",
                                                   "high_priority")
                     if getattr(args, k) is not None}
        return [dataclasses.replace(f, **overrides) for f in fleets]
    fleet = Fleet(args.tenants.name, args.tenants, gpus=args.gpus, high_priority=args.high_priority)
    for knob in ("hours", "load", "work_scale"):
        if getattr(args, knob) is not None:
            fleet = dataclasses.replace(fleet, **{knob: getattr(args, knob)})
    return [fleet]


def _prepare(fleet: Fleet, args: argparse.Namespace) -> Prepared:
    config = load_tenants(fleet.tenants)
    tenants = dict(config.tenants)
    if args.grace_s is not None:
        if not (math.isfinite(args.grace_s) and args.grace_s > 0):
            raise ValueError(f"--grace-s: {args.grace_s!r} is not a number of seconds > 0")
        tenants = {n: dataclasses.replace(t, grace_s=args.grace_s) for n, t in tenants.items()}
    gpus = fleet.gpus if fleet.gpus is not None else config.fleet_gpus
    if gpus < 1:
        raise ValueError(f"--gpus: {gpus} (the fleet's GPUs) is not at least 1")
    for name, value in (("--hours", fleet.hours), ("--load", fleet.load),
                        ("--work-scale", fleet.work_scale)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: {value!r} is not a number > 0")
    price = config.checkpoint_wait_price if args.price is None else _price(args.price)
    high = fleet.high_priority if fleet.high_priority is not None else max(
        t.priority for t in tenants.values())
    return Prepared(fleet, config, tenants, gpus, high, price)


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--seeds: {text!r} is not whole numbers >= 0 (1,2,3 or 1-20)")
        seeds.extend(range(int(lo), int(hi or lo) + 1))
    if not seeds:
        raise ValueError(f"--seeds: {text!r} names no seed")
    return list(dict.fromkeys(seeds))


def _price(value: float) -> float:
    if not 0 <= value <= MAX_WAIT_PRICE:
        raise ValueError(f"--price: {value!r} is not a number in [0, {MAX_WAIT_PRICE:g}]")
    return value


def _prices(text: str) -> list[float]:
    try:
        prices = [float(p) for p in text.split(",")]
    except ValueError:
        raise ValueError(f"--prices: {text!r} is not comma-separated numbers") from None
    return sorted({_price(p) for p in prices})


def _span(seeds: Sequence[int]) -> str:
    if list(seeds) == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


# -- running ---------------------------------------------------------------------------------

def _workload(task: tuple[Prepared, int]) -> tuple[str, int, list[JobArrival]]:
    p, seed = task
    arrivals = synthetic_arrivals(p.tenants, seed=seed, capacity_gpus=p.gpus,
                                  horizon_s=p.fleet.hours * 3600.0, load=p.fleet.load,
                                  work_scale=p.fleet.work_scale)
    return p.fleet.name, seed, arrivals


def _simulate(task: tuple[Prepared, int, list[JobArrival], Policy, float]
              ) -> tuple[Run, int, SimulationResult]:
    p, seed, arrivals, policy, price = task
    result = simulate(arrivals, p.tenants, p.gpus, policy, until=p.fleet.hours * 3600.0,
                      resume_after_s=p.config.resume_after_s, wait_price=price)
    return (p.fleet.name, policy, price), seed, result


def _run_all(prepared: Sequence[Prepared], seeds: Sequence[int], prices: Sequence[float],
             jobs: int) -> tuple[dict[str, dict[int, list[JobArrival]]],
                                 dict[Run, list[SimulationResult]]]:
    """Every workload, then every run, in `jobs` processes (results in seed order)."""
    workloads: dict[str, dict[int, list[JobArrival]]] = {p.fleet.name: {} for p in prepared}
    runs: dict[Run, dict[int, SimulationResult]] = {}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for name, seed, arrivals in pool.map(_workload, [(p, s) for p in prepared
                                                         for s in seeds]):
            workloads[name][seed] = arrivals
        tasks = []
        for p in prepared:
            for seed in seeds:
                arrivals = workloads[p.fleet.name][seed]
                tasks += [(p, seed, arrivals, policy, MAX_WAIT_PRICE)
                          for policy in ("none", "classic")]
                tasks += [(p, seed, arrivals, "stage_aware", price)
                          for price in sorted({*prices, p.price})]
        # the longest runs first (stage-aware, the big fleets), so no process idles at the end
        tasks.sort(key=lambda t: (t[3] != "stage_aware", -t[0].gpus))
        for run, seed, result in pool.map(_simulate, tasks):
            runs.setdefault(run, {})[seed] = result
    return workloads, {run: [by_seed[s] for s in seeds] for run, by_seed in runs.items()}


# -- reporting -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Point:
    """Stage-aware at one price against classic, on one fleet."""

    price: float
    summary: PolicySummary
    classic: PolicySummary

    @property
    def lost_ratio(self) -> float | None:
        return _ratio(self.summary.lost_to_preemption.total,
                      self.classic.lost_to_preemption.total)

    @property
    def p90_ratio(self) -> float | None:
        return _ratio(self.summary.high_wait_p90_s, self.classic.high_wait_p90_s)

    @property
    def lost_ok(self) -> bool:
        return (self.summary.lost_to_preemption.total
                <= LOST_TARGET * self.classic.lost_to_preemption.total)

    @property
    def p90_ok(self) -> bool:
        ours, theirs = self.summary.high_wait_p90_s, self.classic.high_wait_p90_s
        return ours is not None and theirs is not None and ours <= P90_TARGET * theirs

    @property
    def met(self) -> bool:
        return self.lost_ok and self.p90_ok


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    """`ours / theirs`; None when either is unknown or `theirs` is 0."""
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs


def _point(price: float, summary: PolicySummary, classic: PolicySummary) -> Point:
    return Point(price, summary, classic)


def _report(p: Prepared, seeds: Sequence[int], prices: Sequence[float],
            workloads: dict[int, list[JobArrival]],
            results: dict[Run, list[SimulationResult]]) -> tuple[Point, list[Point]]:
    name = p.fleet.name
    summaries = {policy: summarise(results[(name, policy, MAX_WAIT_PRICE)],
                                   high_priority=p.high_priority)
                 for policy in ("none", "classic")}
    classic = summaries["classic"]
    points = {price: _point(price, summarise(results[(name, "stage_aware", price)],
                                             high_priority=p.high_priority), classic)
              for price in sorted({*prices, p.price})}
    _header(p, seeds, workloads)
    default = points[p.price]
    _table(summaries["none"], classic, default)
    _details(p, classic, default, results)
    _halves(p, seeds, results)
    _sweep(points, classic, p.price)
    sweep = [points[price] for price in prices]
    print(f"{name}: target at the default price {p.price:g} "
          f"({_verdict(default)}); prices meeting it on this fleet: "
          f"{', '.join(f'{x.price:g}' for x in sweep if x.met) or 'none'}")
    print()
    return default, sweep


def _header(p: Prepared, seeds: Sequence[int], workloads: dict[int, list[JobArrival]]) -> None:
    f = p.fleet
    capacity_s = p.gpus * f.hours * 3600.0
    drawn = [sum(a.offered_gpu_s for a in w) / capacity_s for w in workloads.values()]
    print(f"## fleet {f.name}: {_shown(f.tenants)}, {p.gpus} GPUs, {f.hours:g} h, offered "
          f"load {f.load:.2f} (as drawn: {min(drawn):.2f}-{max(drawn):.2f}), job lengths "
          f"x{f.work_scale:g}, resume_after_s {p.config.resume_after_s:g}, seeds "
          f"{_span(seeds)}; high priority: >= {p.high_priority}")
    for name, policy in p.tenants.items():
        jobs = [a for w in workloads.values() for a in w if a.tenant == name]
        gpus = Counter(a.gpus for a in jobs)
        hours = sorted(a.work_s / 3600 for a in jobs)
        median = f", training median {hours[len(hours) // 2]:.1f} h" if hours else ""
        print(f"  {name:<18} priority {policy.priority:>3}, quota {policy.quota_gpus:>3} + "
              f"borrow {policy.borrow_limit_gpus:>3}, grace {policy.grace_s:g} s, min run "
              f"{policy.min_run_s:g} s, preemptible {'yes' if policy.preemptible else 'no '}"
              f": {len(jobs)} jobs{median}, GPUs {_sizes(gpus)}")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _sizes(gpus: Counter[int]) -> str:
    return " ".join(f"{size}x{n}" for size, n in sorted(gpus.items())) or "-"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f}"


def _times(ratio: float | None) -> str:
    """A ratio to classic; "-" where classic's figure is 0 or unknown."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def _table(none: PolicySummary, classic: PolicySummary, ours: Point) -> None:
    print(f"{'policy':<20}{'lost GPU-h':>11}{'unsaved':>9}{'restart':>9}{'save':>7}"
          f"{'vs classic':>11}{'hi p50 min':>11}{'hi p90 min':>11}{'p90 vs cl':>10}"
          f"{'ETT%':>7}{'preempt/job':>12}{'max':>5}{'finished':>13}")
    rows = [("none", none), ("classic", classic),
            (f"stage_aware ({ours.price:g})", ours.summary)]
    for label, s in rows:
        lost = s.lost_to_preemption
        print(f"{label:<20}{lost.total / 3600:>11.1f}{lost.unsaved / 3600:>9.1f}"
              f"{lost.restart / 3600:>9.1f}{lost.save / 3600:>7.1f}"
              f"{_times(_ratio(lost.total, classic.lost_to_preemption.total)):>11}"
              f"{_minutes(s.high_wait_p50_s):>11}{_minutes(s.high_wait_p90_s):>11}"
              f"{_times(_ratio(s.high_wait_p90_s, classic.high_wait_p90_s)):>10}"
              f"{s.ett_pct:>7.2f}{s.preemptions_per_job:>12.3f}{s.max_preemptions:>5}"
              f"{f'{s.finished}/{s.jobs}':>13}")


def _details(p: Prepared, classic: PolicySummary, ours: Point,
             results: dict[Run, list[SimulationResult]]) -> None:
    s = ours.summary
    print(f"high priority: the {s.high_jobs} jobs of priority >= {s.high_priority}; waits "
          f"are first waits, arrival to first start ({s.high_not_started} not started by "
          "the end in stage_aware); ETT% is new-data training GPU-seconds over E2E "
          "GPU-seconds (arrival to the end)")
    runs: list[tuple[str, PolicySummary, Run]] = [
        ("classic", classic, (p.fleet.name, "classic", MAX_WAIT_PRICE)),
        (f"stage_aware ({ours.price:g})", s, (p.fleet.name, "stage_aware", ours.price))]
    for label, summary, run in runs:
        exits = ", ".join(f"{n} {e.replace('_', ' ')}" for e, n in summary.exits.items() if n)
        victims = Counter(x.stage + (" (saving)" if x.saving else "")
                          for r in results[run] for x in r.preemptions)
        where = ", ".join(f"{n} {stage}" for stage, n in sorted(victims.items()))
        print(f"{label}: {summary.preemptions} preemptions ({exits or 'none'}); victims in "
              f"{where or 'nothing'}; yields withdrawn (the waiting job started first): "
              f"{summary.withdrawn_yields}")


def _halves(p: Prepared, seeds: Sequence[int],
            results: dict[Run, list[SimulationResult]]) -> None:
    """The default price on each half of the seeds: how much the verdict moves with them."""
    if len(seeds) < 4:
        return
    half = len(seeds) // 2
    parts = []
    for lo, hi in ((0, half), (half, len(seeds))):
        classic = summarise(results[(p.fleet.name, "classic", MAX_WAIT_PRICE)][lo:hi],
                            high_priority=p.high_priority)
        ours = _point(p.price, summarise(results[(p.fleet.name, "stage_aware", p.price)][lo:hi],
                                         high_priority=p.high_priority), classic)
        parts.append(f"seeds {_span(seeds[lo:hi])}: lost {_times(ours.lost_ratio)}, p90 "
                     f"{_times(ours.p90_ratio)}")
    print(f"noise, the default price on each half of the seeds: {'; '.join(parts)}")


def _sweep(points: dict[float, Point], classic: PolicySummary, default: float) -> None:
    print("the price of a wait (stage_aware; checkpoint_wait_price: GPU-seconds of a victim's "
          "work one waiting GPU-second is worth, at the top priority):")
    print(f"  {'price':>8}{'lost GPU-h':>11}{'vs classic':>11}{'hi p50 min':>11}"
          f"{'hi p90 min':>11}{'p90 vs cl':>10}{'at ckpt':>9}  target")
    print(f"  {'classic':>8}{classic.lost_to_preemption.total / 3600:>11.1f}{'1.00x':>11}"
          f"{_minutes(classic.high_wait_p50_s):>11}{_minutes(classic.high_wait_p90_s):>11}"
          f"{'1.00x':>10}{'-':>9}")
    for price, x in points.items():
        mark = " (default)" if price == default else ""
        print(f"  {price:>8g}{x.summary.lost_to_preemption.total / 3600:>11.1f}"
              f"{_times(x.lost_ratio):>11}{_minutes(x.summary.high_wait_p50_s):>11}"
              f"{_minutes(x.summary.high_wait_p90_s):>11}{_times(x.p90_ratio):>10}"
              f"{x.summary.exits['at_checkpoint']:>9}  "
              f"{'MET' if x.met else 'no'}{mark}")


def _verdict(x: Point) -> str:
    lost = x.lost_ratio
    p90 = x.p90_ratio
    lost_text = (f"{lost:.2f}x" if lost is not None else
                 f"{x.summary.lost_to_preemption.total / 3600:.1f} GPU-h where classic lost "
                 f"{x.classic.lost_to_preemption.total / 3600:.1f}")
    p90_text = (f"{p90:.2f}x" if p90 is not None else
                f"{_minutes(x.summary.high_wait_p90_s)} min where classic's is "
                f"{_minutes(x.classic.high_wait_p90_s)}")
    return (f"{'MET' if x.met else 'NOT MET'}: lost {lost_text} "
            f"({'<=' if x.lost_ok else '>'} {LOST_TARGET:g}x classic's), high-priority p90 "
            f"{p90_text} ({'<=' if x.p90_ok else '>'} {P90_TARGET:g}x)")


def _summary(prepared: Sequence[Prepared], prices: Sequence[float],
             verdicts: Sequence[tuple[Point, list[Point]]]) -> None:
    """The target on every fleet at the default price, the prices that meet it on every
    fleet, and, for each fleet where the default misses, what stands in the way."""
    print(f"target (on every fleet, stage_aware loses <= {LOST_TARGET:g}x classic's GPU-hours "
          f"to preemption and its high-priority p90 first wait is <= {P90_TARGET:g}x "
          "classic's):")
    for p, (default, _) in zip(prepared, verdicts, strict=True):
        print(f"  {p.fleet.name} at {default.price:g}: {_verdict(default)}")
    everywhere = [price for i, price in enumerate(prices)
                  if all(sweep[i].met for _, sweep in verdicts)]
    print(f"  prices meeting it on every fleet: "
          f"{', '.join(f'{x:g}' for x in everywhere) or 'none of those swept'}")
    for p, (default, sweep) in zip(prepared, verdicts, strict=True):
        if default.met:
            continue
        print(f"  in the way on {p.fleet.name}: {_in_the_way(sweep)}")


def _in_the_way(sweep: Sequence[Point]) -> str:
    """The best each side of the target reaches over the sweep, and at what cost."""
    def described(x: Point) -> str:
        return f"{x.price:g} (lost {_times(x.lost_ratio)}, p90 {_times(x.p90_ratio)})"

    lost_ok = [x for x in sweep if x.lost_ok]
    p90_ok = [x for x in sweep if x.p90_ok]
    if not lost_ok:
        best = min(sweep, key=lambda x: math.inf if x.lost_ratio is None else x.lost_ratio)
        return (f"no price loses <= {LOST_TARGET:g}x (the least at {described(best)})"
                + (f"; p90 holds from {described(p90_ok[0])}; {_made_of(p90_ok[0])}"
                   if p90_ok else ""))
    if not p90_ok:
        best = min(sweep, key=lambda x: math.inf if x.p90_ratio is None else x.p90_ratio)
        return (f"no price keeps p90 <= {P90_TARGET:g}x (the best at {described(best)}); "
                f"lost holds up to {described(lost_ok[-1])}")
    return (f"lost holds up to {described(lost_ok[-1])}, p90 only from "
            f"{described(p90_ok[0])}: the two sides do not meet; {_made_of(p90_ok[0])}")


def _made_of(x: Point) -> str:
    """What the loss is made of where the p90 holds, as shares of classic's whole loss:
    restarts, which no way of leaving avoids, beside what leaving costs."""
    ours, theirs = x.summary.lost_to_preemption, x.classic.lost_to_preemption
    if theirs.total <= 0:
        return "classic lost nothing"
    def share(v: float) -> str:
        return f"{v / theirs.total:.2f}x"
    return (f"at {x.price:g} restarts alone are {share(ours.restart)} of classic's loss "
            f"(classic's own {share(theirs.restart)}), unsaved work {share(ours.unsaved)}, "
            f"saves {share(ours.save)}, over {x.summary.preemptions} preemptions (classic "
            f"{x.classic.preemptions})")


if __name__ == "__main__":
    sys.exit(main())
