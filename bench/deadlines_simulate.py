#!/usr/bin/env python3
"""Benchmark: finishing bags by a deadline with `spotbag simulate` (issue 27's acceptance).

The settings of bench/deadlines.py (the pure policy simulator, policies/deadline_sim.py)
run through controller/simulation.py instead, the code `spotbag simulate` runs: the
real scheduler, store, planner and deadline policies on the sim driver's virtual clock,
the spot market following the shipped 2015 EC2 spot price trace (`--price-trace`:
spot VMs launch at or below their bid, the on-demand price, are preempted when the
price rises above it, and are billed the trace's price over their lives), VM lifetimes
drawn from the shipped bathtub fits of Google's preemptions.

Each seed (the same draws as bench/deadlines.py's): a bag of 1,000 jobs × 1–4 h
(uniform, whole minutes; each job's runtime its parameter `runtime_s`, listed longest
first, the order the scheduler takes them in; the bag's estimate their mean, ~2.5 h;
each job's own estimate its `runtime_s` (`estimated_runtime_param`: exact, as the pure
simulator's; with `--bag-estimate` none, and the policies plan every job at the bag's
one estimate, the 90th percentile of the runtimes finished so far), checkpointable
(1 minute, by the DP plan), on 100 one-job VMs (`max_vms`), 3-minute launches; one of
the trace's 15 (type, zone) series from a random moment; one of four GCE model keys.
Deadlines at 1.1×, 1.5× and 3× the bag's all-on-demand makespan (list scheduling,
longest first, on 100 slots). For each of all spot (`on_demand: never`), all
on-demand (`always`), Uniform Progress (`deadline_policy: uniform_progress`) and
spotbag's policy (`when_needed`, `deadline_confidence: 0.99`): deadlines met (%),
mean cost (what the bag's VMs were billed: the bag view's `spot_cost_usd`), and
spotbag's cost against UP's over the seeds where both met the deadline.

Output kept in bench/results/deadlines_simulate.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import against, load_average
from tee import Tee

from controller.config import load_config
from controller.simulation import simulate
from controller.traces.price_trace import read_trace
from controller.traces.reference_data import SPOT_PRICES
from policies.deadline_sim import all_on_demand_makespan_h

RESULTS = Path(__file__).resolve().parent / "results"
MODEL_KEYS = ("gce/*/*", "gce/n1-highcpu-16/*", "gce/n1-highcpu-2/*", "gce/n1-highcpu-32/*")
FACTORS = (1.1, 1.5, 3.0)
JOBS, SLOTS = 1000, 100
LAUNCH_S = 180.0
TICK_S = 10.0  # the scheduler acts at most once per 10 s (its deadline decisions: as often)
PRICE_STEP_S = 300.0  # the grid the seed's start is drawn on (as bench/deadlines.py)
CONFIDENCE = 0.99
STRATEGIES = {  # name: (on_demand, deadline_policy)
    "all_spot": ("never", "spotbag"),
    "all_on_demand": ("always", "spotbag"),
    "uniform_progress": ("when_needed", "uniform_progress"),
    "spotbag": ("when_needed", "spotbag"),
}
LABELS = {
    "all_spot": "all spot",
    "all_on_demand": "all on-demand",
    "uniform_progress": "Uniform Progress",
    "spotbag": "spotbag (c = 0.99)",
}


@dataclass(frozen=True)
class Run:
    met: bool
    cost_usd: float
    makespan_h: float
    on_demand_h: float  # VM-hours on on-demand VMs
    wall_s: float


def bag_spec(
    works_h: np.ndarray, deadline_s: int, strategy: str, own_estimates: bool = True
) -> dict:
    on_demand, policy = STRATEGIES[strategy]
    return {
        "account": "bench",
        "command": "run {i}",
        # Longest first, the order the scheduler takes them in (by index): list
        # scheduling's, as the makespan the deadlines are set by and the pure
        # simulator's; the daemon knows only the bag's estimate of each.
        "points": [
            {"i": i, "runtime_s": float(w * 3600.0)}
            for i, w in enumerate(sorted(works_h.tolist(), reverse=True))
        ],
        "resources": {"cpus": 1, "memory_gb": 1},
        "max_runtime_s": 5 * 3600,
        "estimated_runtime_s": float(works_h.mean() * 3600.0),
        # Each job's own estimate (exact here, as the pure simulator's): the policies
        # plan each job at it, scaled by what the finished jobs took against theirs.
        **({"estimated_runtime_param": "runtime_s"} if own_estimates else {}),
        "checkpointable": True,
        "checkpoint_cost_s": 60,
        "max_attempts": 100,
        "deadline": f"{deadline_s}s",
        "on_demand": on_demand,
        "deadline_policy": policy,
        "deadline_confidence": CONFIDENCE,
        "simulation": {"runtime_param": "runtime_s"},
    }


def run_config(series: tuple[str, str], on_demand_usd: float, start_s: float, model_key: str):
    return load_config(
        None,
        **{
            "scheduler.max_vms": SLOTS,
            "preemption.model": "fitted",
            "simulation.boot_delay_s": LAUNCH_S,
            "simulation.tick_s": TICK_S,
            "simulation.projection_every_s": 3600.0,
            "simulation.price_trace": str(SPOT_PRICES),
            "simulation.trace_series": f"{series[0]}/{series[1]}",
            "simulation.trace_start": f"{start_s:.0f}",
            "vm_types": [
                {
                    "name": series[0],
                    "zone": series[1],
                    "cpus": 1,
                    "memory_gb": 4,
                    # The catalog's spot price is not what is paid (the trace's is).
                    "spot_price_per_hour": on_demand_usd,
                    "on_demand_price_per_hour": on_demand_usd,
                    "model_key": model_key,
                }
            ],
        },
    )


async def one_run(spec: dict, config, seed: int, deadline_s: int) -> Run:
    state_dir = Path(tempfile.mkdtemp(prefix="spotbag-dlsim-"))
    try:
        result = await simulate(spec, config, seed=seed, state_dir=state_dir)
        with sqlite3.connect(state_dir / "spotbag.db") as db:
            # VM-hours billed (running to ended) on each market, from the run's store.
            hours = dict(
                db.execute(
                    "SELECT spot, sum(ended_at - running_at) / 3600.0 FROM vms "
                    "WHERE running_at IS NOT NULL GROUP BY spot"
                ).fetchall()
            )
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
    bag = result.bag
    done = bag["counts"]["succeeded"] == JOBS
    elapsed_s = bag["elapsed_s"]
    on_demand_h = hours.get(0) or 0.0
    return Run(
        met=done and elapsed_s <= deadline_s + 1e-6,
        cost_usd=bag["usage"]["spot_cost_usd"],
        makespan_h=elapsed_s / 3600.0 if done else float("inf"),
        on_demand_h=on_demand_h,
        wall_s=result.wall_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help="comma-separated (default: all)"
    )
    parser.add_argument("--factors", default=",".join(f"{f:g}" for f in FACTORS))
    parser.add_argument("--output", default="deadlines_simulate.txt")
    parser.add_argument(
        "--bag-estimate",
        action="store_true",
        help="no job's own estimate (no estimated_runtime_param): every job planned at "
        "the bag's one estimate, the 90th percentile of the runtimes finished so far",
    )
    args = parser.parse_args()
    strategies = [s for s in args.strategies.split(",") if s]
    factors = [float(f) for f in args.factors.split(",") if f]
    out = Tee(sys.stdout)
    started = time.perf_counter()
    trace = read_trace(SPOT_PRICES)
    times, prices = trace.grid(PRICE_STEP_S, trace.common_start_s)
    span = 12 * 24 * 12  # 12 days of 5-minute prices: beyond every run
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(
        f"spotbag simulate (controller/simulation.py): bags of {JOBS} jobs x 1-4 h on {SLOTS} "
        f"one-job VMs, {args.seeds} seeds ({seeds[0]}-{seeds[-1]}), deadlines at "
        f"{', '.join(f'{f:g}x' for f in factors)} the all-on-demand makespan; 2015 EC2 spot "
        f"trace, shipped GCE fits, 3-minute launches, 1-minute checkpoints; "
        f"{'the bag' if args.bag_estimate else 'each job its own'} estimate",
        file=out,
    )
    results: dict[tuple[str, float], list[Run]] = {(s, f): [] for s in strategies for f in factors}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        works = np.round(rng.uniform(1.0, 4.0, JOBS) * 60.0) / 60.0
        vm = seed % len(trace.vms)
        start = int(rng.integers(0, len(prices) - span))
        model_key = MODEL_KEYS[seed % len(MODEL_KEYS)]
        config = run_config(trace.vms[vm], float(trace.on_demand[vm]), times[start], model_key)
        makespan_h = all_on_demand_makespan_h(works, SLOTS, LAUNCH_S / 3600.0)
        for factor in factors:
            deadline_s = int(factor * makespan_h * 3600.0)
            for strategy in strategies:
                run = asyncio.run(
                    one_run(
                        bag_spec(works, deadline_s, strategy, not args.bag_estimate),
                        config,
                        10_000 + seed,
                        deadline_s,
                    )
                )
                results[(strategy, factor)].append(run)
                print(
                    f"  seed {seed:>3} {'/'.join(trace.vms[vm])} {model_key:<20} {factor:>4g}x "
                    f"{LABELS[strategy]:<20} {'met ' if run.met else 'MISS'} "
                    f"{run.cost_usd:>9.2f} $ {run.makespan_h:>6.1f} h "
                    f"(deadline {deadline_s / 3600:.1f} h) od {run.on_demand_h:>5.0f} h "
                    f"{run.wall_s:>5.1f} s",
                    file=out,
                    flush=True,
                )
    simulated = time.perf_counter() - started
    report(out, results, strategies, factors)
    runs = sum(len(r) for r in results.values())
    print(f"\n{runs} simulations in {simulated:.0f} s; {load_average()}", file=out)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / args.output).write_text("".join(out.parts))


def report(out, results, strategies, factors) -> None:
    print(
        f"\n{'strategy':<20} {'deadline':>8} {'met':>7} {'mean cost':>10} {'vs on-demand':>13} "
        f"{'makespan':>9} {'on-demand h':>12}",
        file=out,
    )
    for strategy in strategies:
        for factor in factors:
            runs = results[(strategy, factor)]
            met = 100.0 * sum(r.met for r in runs) / len(runs)
            cost = statistics.mean(r.cost_usd for r in runs)
            base = results.get(("all_on_demand", factor))
            ratio = (
                f"{statistics.mean(r.cost_usd / b.cost_usd for r, b in zip(runs, base, strict=True)):>12.1%}"
                if base
                else f"{'-':>12}"
            )
            finite = [r.makespan_h for r in runs if np.isfinite(r.makespan_h)]
            makespan = f"{statistics.mean(finite):.1f} h" if finite else "-"
            od_h = statistics.mean(r.on_demand_h for r in runs)
            print(
                f"{LABELS[strategy]:<20} {factor:>7g}x {met:>6.1f}% {cost:>9.2f}$ {ratio} "
                f"{makespan:>9} {od_h:>12.0f}",
                file=out,
            )
    if "spotbag" not in strategies:
        return
    print("\nTargets (issue 27):", file=out)
    spotbag = [r for f in factors for r in results[("spotbag", f)]]
    met = 100.0 * sum(r.met for r in spotbag) / len(spotbag)
    print(
        f"  spotbag's policy meets {met:.1f} % of {len(spotbag)} deadlines "
        f"{against(met, 99.0, '%', at_least=True)}",
        file=out,
    )
    if "uniform_progress" not in strategies:
        return
    for factor in factors:
        pairs = [
            (s, u)
            for s, u in zip(
                results[("spotbag", factor)], results[("uniform_progress", factor)], strict=True
            )
            if s.met and u.met
        ]
        if not pairs:
            print(f"  {factor:g}x: no seed where both meet the deadline", file=out)
            continue
        ours = statistics.mean(s.cost_usd for s, _ in pairs)
        theirs = statistics.mean(u.cost_usd for _, u in pairs)
        cheaper = sum(s.cost_usd < u.cost_usd - 1e-9 for s, u in pairs)
        dearer = sum(s.cost_usd > u.cost_usd + 1e-9 for s, u in pairs)
        print(
            f"  {factor:g}x ({len(pairs)} seeds both met): spotbag {ours:.2f} $ vs Uniform "
            f"Progress {theirs:.2f} $ = {ours / theirs:.1%} ({theirs - ours:+.2f} $ saved a bag, "
            f"{1 - ours / theirs:.1%}); cheaper in {cheaper}, dearer in {dearer} seeds "
            f"{against(100.0 * ours / theirs, 100.0, '% of UP')}",
            file=out,
        )


if __name__ == "__main__":
    main()
