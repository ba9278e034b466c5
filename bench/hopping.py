#!/usr/bin/env python3
"""Benchmark and reproduction: spot hopping by cloud-index tracking (docs/design.md#index-tracking).

1. The paper's synthetic experiment over many seeds: four VMs (m4.large 2/8,
   m4.2xlarge 8/32, c4.2xlarge 8/15, r4.xlarge 4/30.5 vCPU/GB) with uniform prices
   each minute, mean 4.5, 8.5, 6.5, 6.5 ¢/h and deviation 0.5, 0.5, 1.0, 1.1 ¢/h; a
   1-hour job, 30 min at 4 vCPU/16 GB then 30 min at 2 vCPU/8 GB; a decision every
   minute over the hour of prices before it; stop-and-copy migration at 1 s per GB.
   Cost is normalised to the paper's reference: a VM costing the average price of all
   four VMs over the same time.
2. The real 2015 us-east-1 trace (shipped: `spotbag data path spot-prices`): a job of at least
   2 vCPU/10 GB over the whole trace, 30 s per migration, 90 s per revocation, bid =
   on-demand, a decision every 5 minutes over a 1-day window; cost normalised to the
   cheapest fitting on-demand VM (r3.large, $0.175/h); the index's volatility against
   the individual prices.
3. Timings: one decision over 1,000 VM types with a 1-day window (target <= 5 ms) and
   replaying the whole trace at 5-minute steps (target <= 10 s).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from charts import plot_hopping
from targets import against
from tee import Tee

from controller.tools.hopping_report import (
    compositions,
    replay_row,
    replay_trace,
    summarize_index,
)
from controller.tools.plots import plot_index
from controller.traces.price_trace import read_trace
from controller.traces.reference_data import SPOT_PRICES
from policies.hopping import Fleet, Phase, replay, synthetic_prices
from policies.index import Market, Need, Policy, decide

RESULTS = Path(__file__).resolve().parent / "results"
TRACE = SPOT_PRICES  # shipped with spotbag (controller/data/reference/)
SEEDS = 500

SYNTHETIC_FLEET = Fleet(
    names=("m4.large", "m4.2xlarge", "c4.2xlarge", "r4.xlarge"),
    cpus=np.array([2.0, 8.0, 8.0, 4.0]),
    memory_gb=np.array([8.0, 32.0, 15.0, 30.5]),
    on_demand=np.array([0.10, 0.40, 0.398, 0.266]),
    bid=np.array([0.10, 0.40, 0.398, 0.266]),
)
MEANS = [0.045, 0.085, 0.065, 0.065]
STDS = [0.005, 0.005, 0.010, 0.011]
JOB = [Phase(0.5, 4, 16), Phase(0.5, 2, 8)]


def synthetic(out, literal: bool = False, std_scale: float = 1.0) -> dict[str, dict]:
    per_policy: dict[str, list] = {p.value: [] for p in Policy}
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        prices = synthetic_prices(rng, MEANS, [s * std_scale for s in STDS], 120)
        for policy in Policy:
            result = replay(
                prices,
                1 / 60,
                SYNTHETIC_FLEET,
                JOB,
                policy,
                window_steps=60,
                decide_every=1,
                migration_s_per_gb=1.0,
                literal_trigger=literal,
                start_step=60,
            )
            steps = round(result.wall_h * 60)
            reference_usd = float(prices[60 : 60 + steps].mean(axis=1).sum()) / 60
            per_policy[policy.value].append((result, result.cost_usd / reference_usd))
    summary = {}
    for name, results in per_policy.items():
        summary[name] = {
            "policy": name,
            "normalized_cost": statistics.mean(c for _, c in results),
            "availability": statistics.mean(r.availability for r, _ in results),
            "migrations": statistics.mean(r.migrations for r, _ in results),
            "finished": sum(r.finished for r, _ in results),
        }
    label = " (paper's literal eq. 5)" if literal else ""
    label += f" (price deviation × {std_scale:g})" if std_scale != 1.0 else ""
    print(f"\nSynthetic experiment, {SEEDS} seeds{label}: mean over seeds", file=out)
    print(f"{'policy':<13} {'cost/avg VM':>11} {'availability':>13} {'migrations':>10}", file=out)
    for row in summary.values():
        print(
            f"{row['policy']:<13} {row['normalized_cost']:>11.3f} {row['availability']:>13.4f} "
            f"{row['migrations']:>10.2f}",
            file=out,
        )
    cost, avail, bal = summary["cost"], summary["availability"], summary["balanced"]
    print(
        f"balanced vs cost-centric cost: {bal['normalized_cost'] / cost['normalized_cost'] - 1:+.1%}; "
        f"vs availability-aware availability: {bal['availability'] / avail['availability'] - 1:+.2%} "
        "(paper: within 12% and 1.7%)",
        file=out,
    )
    return summary


def real_trace(out) -> None:
    started = time.perf_counter()
    trace = read_trace(TRACE)
    read_s = time.perf_counter() - started
    print(f"\nReal trace {TRACE.name}: {len(trace.vms)} VMs, read in {read_s:.2f} s", file=out)
    for literal in (False, True):
        started = time.perf_counter()
        results = replay_trace(
            trace,
            list(Policy),
            [Phase(float("inf"), 2, 10)],
            step_s=300,
            window_s=86400,
            decide_every_s=300,
            migration_s=30,
            revocation_s=90,
            literal_trigger=literal,
        )
        took = time.perf_counter() - started
        rows = [replay_row(r) for r in results]
        title = "paper's literal eq. 5" if literal else "corrected migration rule"
        print(
            f"job 2 vCPU/10 GB over {results[0].wall_h:,.0f} h, {title} "
            f"(4 policies replayed in {took:.2f} s, {took / 4:.2f} s each "
            f"{against(took / 4, 10, 's per policy')}):",
            file=out,
        )
        print(
            f"{'policy':<13} {'cost $':>8} {'vs on-demand':>12} {'vs index':>9} "
            f"{'availability':>12} {'migrations':>10} {'revocations':>11}",
            file=out,
        )
        for r, row in zip(results, rows, strict=True):
            print(
                f"{row['policy']:<13} {row['cost_usd']:>8.2f} {row['normalized_cost']:>12.3f} "
                f"{r.index_normalized_cost:>9.3f} {row['availability']:>12.5f} "
                f"{row['migrations']:>10} {row['revocations']:>11}",
                file=out,
            )
        if not literal:
            plot_hopping(
                RESULTS / "hopping_real_trace.png",
                rows,
                "us-east-1 2015, job 2 vCPU/10 GB, 5-min decisions, 1-day window",
            )
    for by in ("zone", "region", "family"):
        times, series, normalized, summaries = summarize_index(trace, by, 300)
        print(f"\nIndex volatility by {by} (std/mean over the trace, normalised prices):", file=out)
        for s in summaries:
            print(
                f"  {s.composition:<11} {len(s.members):>2} VMs: index {s.index_cv:.3f}, "
                f"members mean {s.members_cv_mean:.3f} (max {s.members_cv_max:.3f}): "
                f"{s.calmer_by:.1f}x calmer; {s.capped_share:.1%} of prices capped",
                file=out,
            )
        if by == "zone":
            members = compositions(trace, by)
            plot_index(
                RESULTS / "index_by_zone.png", times, series, normalized, trace.vms, members, by
            )


def decision_timing(out) -> None:
    rng = np.random.default_rng(0)
    n_types, window = 1000, 288  # 1 day at 5-minute samples
    cpus = rng.choice([2, 4, 8, 16, 32, 64], n_types).astype(float)
    memory = cpus * rng.choice([2.0, 4.0, 8.0], n_types)
    on_demand = 0.05 * np.sqrt(cpus * memory)
    prices = on_demand * rng.uniform(0.2, 0.6, (window, n_types))
    market = Market(prices, cpus, memory, on_demand, on_demand)
    need = Need(4, 16, 10.0, 30 / 3600)
    for label, win in (
        ("1-day window at 5-min samples", 288),
        ("1-day window at 1-min samples", 1440),
    ):
        market = Market(
            on_demand * rng.uniform(0.2, 0.6, (win, n_types)), cpus, memory, on_demand, on_demand
        )
        for policy in Policy:
            decide(policy, market, need, 3)  # warm
        timings = {}
        for policy in Policy:
            runs = []
            for _ in range(50):
                started = time.perf_counter()
                decide(policy, market, need, 3)
                runs.append(time.perf_counter() - started)
            timings[policy.value] = statistics.median(runs) * 1e3
        # The target is for a 1-day window at 5-minute samples; the 1-minute one is shown too.
        target = against(max(timings.values()), 5, "ms") if win == 288 else "(target —)"
        print(
            f"one decision over {n_types} VM types, {label} ({win}×{n_types} prices): "
            + ", ".join(f"{k} {v:.2f} ms" for k, v in timings.items())
            + f" {target}",
            file=out,
        )


def main() -> None:
    out = Tee(sys.stdout)
    print("Spot hopping by cloud-index tracking", file=out)
    decision_timing(out)
    baseline = synthetic(out)
    synthetic(out, literal=True)
    synthetic(out, std_scale=2.0)
    plot_hopping(
        RESULTS / "hopping_synthetic.png",
        list(baseline.values()),
        f"synthetic market (paper §6.1), mean of {SEEDS} seeds; cost / average VM",
    )
    real_trace(out)
    (RESULTS / "hopping.txt").write_text("".join(out.parts))


if __name__ == "__main__":
    main()
