"""Views of bags, jobs and VMs as the API shows them (their text summary, which the
CLI and `spotbag simulate` print, is `controller.cli.render.render_summary`).

A bag's usage: its attempts' times (the ended ones' totals kept in the store, plus the
running ones up to now) and its cost, which is its cost report's (controller/costs/bag_cost.py:
docs/design.md#cost-reports's split of its VMs' cost, as of `cost.as_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from controller.costs.bag_cost import BagCost
from controller.costs.fleet_cost import FleetCost
from controller.states import JobState
from controller.store import job_id_of


def _hours(seconds: float) -> float:
    return seconds / 3600.0


def bag_view(bag: Mapping[str, Any], now: float, cost: BagCost) -> dict[str, Any]:
    spec = json.loads(bag["spec"])
    live = bag.get("live_attempts", [])
    attempt_s = bag["attempt_s"] + sum(max(0.0, now - a["started_at"]) for a in live)
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
            "vm_hours": cost.vm_hours,
            "spot_cost_usd": cost.spot_cost_usd,
            "on_demand_cost_usd": cost.on_demand_cost_usd,
            "savings_usd": cost.savings_usd,
            "cost_as_of": cost.as_of,
            "cost_final": cost.final,
        },
        "spec": spec,
        "options": bag_options(bag, spec),
    }


def bag_options(bag: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The bag's options (docs/bags.md#options) as kept: the deadline resolved, the
    budget as it is now (PATCH may have changed it), the defaults filled in."""
    return {
        "deadline": spec.get("deadline"),
        "deadline_at": bag.get("deadline_at"),
        "on_demand": bag.get("on_demand") or "never",
        "deadline_confidence": bag.get("deadline_confidence", 0.95),
        "budget_usd": bag.get("budget_usd"),
        "notify": spec.get("notify") or [],
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
                    "ran_at",
                )
                if k in a
            }
            | {"vm_type": a.get("vm_type"), "executor_ref": a.get("ref", "")}
            for a in attempts
        ],
        "transitions": job.get("transitions", []),
    }


def fleet_view(fleet: FleetCost) -> dict[str, Any]:
    """Totals over every VM that ran, and per VM type: how many, how many were
    preempted, VM-hours (billed life, idle included) and their cost as of
    `fleet.as_of`, priced as reports price them (controller/costs/fleet_cost.py)."""
    return {**fleet.totals, "cost_as_of": fleet.as_of}
