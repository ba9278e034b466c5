#!/usr/bin/env python3
"""Benchmark: preemption notices in `spotbag simulate` (docs/design.md#checkpoint-notices).

One checkpointable bag (400 jobs of 4 hours, checkpoints of 10 s) on 50 GCE-like VMs
(the shipped n1-highcpu-16 bathtub with its 24 h deadline, 60 s boots), the same seed,
with no notices, 30-s notices (GCE's) and 120-s notices (EC2's). Prints per run the
preemptions, the work lost per preemption, the checkpoints and the time spent writing
them, and the makespan, then the two targets: with 30-s notices at most 10 % of the
notice-less run's lost work, and less checkpoint overhead than the notice-less plan's.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against

from controller.config import load_config
from controller.simulation import simulate

JOBS = 400
SEED = 11
BAG = {
    "account": "bench",
    "command": "run {i}",
    "parameters": {"i": {"range": [0, JOBS]}},
    "resources": {"cpus": 1, "memory_gb": 1},
    "max_runtime_s": 8 * 3600,
    "estimated_runtime_s": 4 * 3600,
    "checkpointable": True,
    "checkpoint_cost_s": 10,
    "max_attempts": 50,
}
GCE_LIKE = {
    "scheduler.max_vms": 50,
    "scheduler.idle_timeout_s": 120.0,
    "simulation.boot_delay_s": 60.0,
    "preemption.model": "bathtub",
    "preemption.bathtub_A": 0.351,
    "preemption.bathtub_tau1": 2.31,
    "preemption.bathtub_tau2": 109.736,
    "preemption.bathtub_b": 0.001,
    "preemption.deadline_h": 24.0,
    "vm_types": [
        {
            "name": "n1-highcpu-16",
            "cpus": 16,
            "memory_gb": 14.4,
            "spot_price_per_hour": 0.12,
            "on_demand_price_per_hour": 0.57,
        }
    ],
}


def preemptions(db: Path) -> int:
    """VMs preempted, and VMs whose jobs moved at a notice (then drained and ended)."""
    with sqlite3.connect(db) as conn:
        preempted = conn.execute("SELECT count(*) FROM vms WHERE state = 'preempted'").fetchone()
        noticed = conn.execute(
            "SELECT count(DISTINCT substr(reason, 26)) FROM attempts "
            "WHERE reason LIKE 'migrated: spot notice on %'"
        ).fetchone()
    return int(preempted[0]) + int(noticed[0])


async def run(lead_s: float) -> dict[str, float]:
    config = load_config(None, **GCE_LIKE, **{"simulation.notice_lead_s": lead_s})
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-notices-") as scratch:
        started = time.process_time()
        result = await simulate(BAG, config, seed=SEED, state_dir=Path(scratch))
        cpu_s = time.process_time() - started
        usage = result.bag["usage"]
        count = preemptions(Path(scratch) / "spotbag.db")
    return {
        "preemptions": count,
        "lost_h": usage["lost_hours"],
        "lost_per_preemption_min": 60 * usage["lost_hours"] / max(count, 1),
        "checkpoints": usage["checkpoints"],
        "checkpoint_h": usage["checkpoint_hours"],
        "makespan_h": result.bag["elapsed_s"] / 3600,
        "cpu_s": cpu_s,
    }


async def main() -> None:
    print(
        f"{JOBS} checkpointable jobs of 4 h (checkpoint 10 s) on 50 GCE-like VMs, seed {SEED}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    runs = {}
    for lead_s, label in ((0.0, "no notices"), (30.0, "30 s notices"), (120.0, "120 s notices")):
        figures = runs[lead_s] = await run(lead_s)
        print(
            f"  {label:>13}: {figures['preemptions']:3.0f} preemptions, work lost "
            f"{figures['lost_h']:6.2f} h ({figures['lost_per_preemption_min']:5.1f} min a "
            f"preemption), {figures['checkpoints']:4.0f} checkpoints "
            f"({figures['checkpoint_h']:.2f} h writing), makespan "
            f"{figures['makespan_h']:.2f} h  [{figures['cpu_s']:.1f} s CPU]"
        )
    none, gce = runs[0.0], runs[30.0]
    share = gce["lost_h"] / none["lost_h"] if none["lost_h"] else 0.0
    print(f"lost work with 30 s notices: {share:.1%} of the notice-less run's", end=" ")
    print(against(100 * share, 10, "%"))
    ratio = gce["checkpoint_h"] / none["checkpoint_h"] if none["checkpoint_h"] else 0.0
    print(
        f"checkpoint overhead with 30 s notices: {gce['checkpoint_h']:.2f} h against "
        f"{none['checkpoint_h']:.2f} h without ({ratio:.0%})",
        against(100 * ratio, 100, "%"),
    )


if __name__ == "__main__":
    asyncio.run(main())
