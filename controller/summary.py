"""Views of bags, jobs and VMs as the API shows them, and the text summary the CLI
and `spotbag simulate` print.

Bag usage = the ended attempts' totals kept in the store + the running attempts
up to now (each attempt charged its share of its VM, policies.cost.vm_share).
"""

from __future__ import annotations

import json
from typing import Any

from controller.models import JobState
from controller.store import job_id_of
from policies.cost import vm_share
from policies.packing import Shape


def _hours(seconds: float) -> float:
    return seconds / 3600.0


def bag_view(bag: dict[str, Any], now: float) -> dict[str, Any]:
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


def job_view(job: dict[str, Any]) -> dict[str, Any]:
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


def fleet_view(usage_rows: list[dict[str, Any]]) -> dict[str, Any]:
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


def _money(usd: float) -> str:
    if abs(usd) < 0.01:
        return f"${usd:.6f}"  # the demo's costs are fractions of a cent
    return f"${usd:,.4f}" if abs(usd) < 10 else f"${usd:,.2f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def render_summary(view: dict[str, Any], fleet: dict[str, Any] | None = None) -> str:
    """The end-of-run summary, as plain text."""
    c, u = view["counts"], view["usage"]
    saved = u["on_demand_cost_usd"] - u["spot_cost_usd"]
    pct = 100.0 * saved / u["on_demand_cost_usd"] if u["on_demand_cost_usd"] > 0 else 0.0
    title = f"bag {view['id']}" + (f" ({view['name']})" if view["name"] else "")
    lines = [
        f"{title}: {view['state']} after {_duration(view['elapsed_s'])}",
        f"  jobs        {c['succeeded']:,} succeeded, {c['failed']:,} failed, {c['cancelled']:,} cancelled"
        f", {c['running']:,} running, {c['queued'] + c['held']:,} waiting (of {view['job_count']:,})",
        f"  attempts    {u['attempts']:,} ({u['interrupted_attempts']:,} interrupted by VM preemptions: "
        f"{_duration(u['preempted_attempt_hours'] * 3600)} of their running time, "
        f"{_duration(u['lost_hours'] * 3600)} of work lost since the last checkpoint)",
        f"  checkpoints {u['checkpoints']:,} written, {_duration(u['checkpoint_hours'] * 3600)} spent writing them",
        f"  VM-hours    {u['vm_hours']:.3f}: this bag's share of its VMs (its jobs ran "
        f"{u['attempt_hours']:.3f} h in all, each on part of a VM)",
        f"  cost        spot {_money(u['spot_cost_usd'])} vs on-demand {_money(u['on_demand_cost_usd'])}"
        f" for the same hours: saved {_money(saved)} ({pct:.0f}%)",
    ]
    if fleet is not None:
        t = fleet["total"]
        fleet_saved = t["on_demand_cost_usd"] - t["spot_cost_usd"]
        lines.append(
            f"  all VMs     {t['vms']:,} VMs of every bag so far, {t['vms_preempted']:,} of them preempted: "
            f"{t['vm_hours']:.3f} VM-hours incl. idle, spot {_money(t['spot_cost_usd'])} vs on-demand "
            f"{_money(t['on_demand_cost_usd'])} (saved {_money(fleet_saved)})"
        )
    return "\n".join(lines)
