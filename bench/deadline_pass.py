"""What the deadline policy costs the daemon's scheduler (docs/design.md#deadlines-in-the-daemon):
the cheap decision `decide(project=False)`, run in a pass whenever a bag with a deadline
changes (so up to once per pass per such bag), and the projection `decide(project=True)`
with the API's three quantiles, run at most every 30 s per bag; for a bag of 1,000
queued jobs x 1-4 h and 100 running on spot VMs of assorted ages, on a GCE bathtub fit.
The completion-time tables are built once per (model, checkpoint table): timed too.

Targets: the cheap decision <= 10 ms (a pass's budget is tens of ms); the projection
<= 500 ms (once per 30 s per bag, in the loop); the tables <= 5 s (a worker thread,
once per model)."""

from __future__ import annotations

import statistics
import time

import numpy as np
from targets import against

from controller.preemption.model_book import load_registry
from policies.checkpoint import build_table
from policies.completion_times import build_completion_times
from policies.deadline import DeadlineInputs, decide

MODEL_KEY = "gce/*/*/*/*"
QUEUED, RUNNING = 1000, 100
LAUNCH_H, DELTA_H = 3 / 60, 1 / 60
REPEATS = 30


def median_ms(call, repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000.0)
    return statistics.median(times)


def main() -> None:
    registry = load_registry()
    model = next(e.model for k, e in registry.entries.items() if k.text() == MODEL_KEY)
    started = time.perf_counter()
    table = build_table(model, 4.0, DELTA_H, restart_h=LAUNCH_H)
    times = build_completion_times(model, table)
    tables_s = time.perf_counter() - started
    rng = np.random.default_rng(1)
    inputs = DeadlineInputs(
        now_h=0.0,
        deadline_h=30.0,
        slots=RUNNING,
        queued_work_h=rng.uniform(1.0, 4.0, QUEUED),
        spot_work_h=rng.uniform(0.1, 4.0, RUNNING),
        spot_age_h=rng.uniform(0.0, 12.0, RUNNING),
        spot_price_per_hour=0.3,
        on_demand_price_per_hour=1.0,
        on_demand_launch_h=LAUNCH_H,
        confidence=0.95,
        decision_lag_h=10 / 3600 + LAUNCH_H,
    )
    cheap_ms = median_ms(lambda: decide(inputs, times, (), project=False))
    projected_ms = median_ms(
        lambda: decide(inputs, times, (0.5, 0.9, 0.95), project=True), repeats=10
    )
    decision = decide(inputs, times, (0.5, 0.9, 0.95), project=True)
    print(
        f"bag of {QUEUED} queued x 1-4 h, {RUNNING} running on spot, {MODEL_KEY}: "
        f"{decision.on_demand_slots} on-demand slots, P(meet) {decision.p_meet:.3f}"
    )
    print(f"cheap decision (median of {REPEATS}): {cheap_ms:.2f} ms {against(cheap_ms, 10, 'ms')}")
    print(
        f"projection, 3 quantiles (median of 10): {projected_ms:.1f} ms {against(projected_ms, 500, 'ms')}"
    )
    print(f"completion-time tables, once per model: {tables_s:.2f} s {against(tables_s, 5, 's')}")


if __name__ == "__main__":
    main()
