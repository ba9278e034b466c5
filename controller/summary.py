"""Views of bags, jobs and VMs as the API shows them (their text summary, which the
CLI and `spotbag simulate` print, is `controller.cli.render.render_summary`).

Bag usage = the ended attempts' totals kept in the store + the running attempts
up to now (each attempt charged its share of its VM, policies.cost.vm_share).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from controller.models import JobState
from controller.store import job_id_of
from policies.cost import vm_share
from policies.packing import Shape


def _hours(seconds: float) -> float:
    return seconds / 3600.0


def bag_view(bag: Mapping[str, Any], now: float) -> dict[str, Any]:
    spec = json.loads(bag["spec"])
    resources = spec.get("resources", {})
    job_shape = Shape(
        resources.get("cpus", 1), resources.get("gpus", 0), resources.get("memory_gb", 1.0)
    )
    attempt_s, vm_s, spot, on_demand = (
        bag["attempt_s"],
        bag["vm_s"],
        bag["spot_cost_usd"],
        bag["on_demand_cost_usd"],
    )
    live = bag.get("live_attempts", [])
    for attempt in live:
        elapsed = max(0.0, now - attempt["started_at"])
        share_s = elapsed * vm_share(
            job_shape, Shape(attempt["cpus"], attempt["gpus"], attempt["memory_gb"])
        )
        attempt_s += elapsed
        vm_s += share_s
        spot += share_s * attempt["spot_price_per_hour"] / 3600.0
        on_demand += share_s * attempt["on_demand_price_per_hour"] / 3600.0
    counts = {state.value: bag["counts"].get(state.value, 0) for state in JobState}
    finished = sum(counts[s.value] for s in JobState.terminal())
    end = bag["finished_at"] if bag["finished_at"] is not None else now
    return {
        "id": bag["id"],
        "name": bag["name"],
        "account": bag["account"],
        "state": bag["state"],
        "cancel_requested": bag["cancel_requested_at"] is not None,
        "created_at": bag["created_at"],
        "finished_at": bag["finished_at"],
        "elapsed_s": end - bag["created_at"],
        "job_count": bag["job_count"],
        "counts": counts,
        "progress": finished / bag["job_count"] if bag["job_count"] else 1.0,
        "usage": {
            "attempts": bag["attempts_ended"] + len(live),
            "interrupted_attempts": bag["preemptions"],
            "attempt_hours": _hours(attempt_s),
            "preempted_attempt_hours": _hours(bag["preempted_s"]),
            "lost_hours": _hours(bag.get("lost_s", 0.0)),
            "checkpoints": bag.get("checkpoints", 0),
            "checkpoint_hours": _hours(bag.get("checkpoint_s", 0.0)),
            "vm_hours": _hours(vm_s),
            "spot_cost_usd": spot,
            "on_demand_cost_usd": on_demand,
            "savings_usd": on_demand - spot,
        },
        "spec": spec,
    }


def job_view(job: Mapping[str, Any]) -> dict[str, Any]:
    attempts = job.get("attempt_list", [])
    return {
        "id": job_id_of(job["bag_id"], job["idx"]),
        "bag_id": job["bag_id"],
        "index": job["idx"],
        "params": json.loads(job["params"]),
        "state": job["state"],
        "attempts": job["attempts"],
        "exit_code": job["exit_code"],
        "reason": job["reason"],
        "vm_id": job["vm_id"],
        "started_at": job["started_at"],
        "ended_at": job["ended_at"],
        "runtime_s": job["runtime_s"],
        "work_saved_s": job.get("work_saved_s", 0.0),
        "checkpoints": job.get("checkpoints", 0),
        "checkpoint_list": job.get("checkpoint_list", []),
        "log_path": attempts[-1]["log_path"] if attempts else None,
        "attempt_list": [
            {
                k: a[k]
                for k in (
                    "number",
                    "vm_id",
                    "state",
                    "started_at",
                    "ended_at",
                    "exit_code",
                    "reason",
                    "log_path",
                )
                if k in a
            }
            | {"vm_type": a.get("vm_type"), "executor_ref": a.get("ref", "")}
            for a in attempts
        ],
        "transitions": job.get("transitions", []),
    }


def fleet_view(usage_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals over VMs: how many, how many were preempted, VM-hours (running time, idle
    included) and their cost."""
    total = {
        "vms": 0,
        "vms_preempted": 0,
        "vm_hours": 0.0,
        "spot_cost_usd": 0.0,
        "on_demand_cost_usd": 0.0,
    }
    by_type = []
    for row in usage_rows:
        entry = {
            "vm_type": row["vm_type"],
            "vms": row["vms"],
            "vms_preempted": row["preemptions"],
            "vm_hours": _hours(row["vm_s"] or 0.0),
            "spot_cost_usd": row["spot_cost_usd"] or 0.0,
            "on_demand_cost_usd": row["on_demand_cost_usd"] or 0.0,
        }
        by_type.append(entry)
        for key in total:
            total[key] += entry[key]
    return {"total": total, "by_vm_type": by_type}
