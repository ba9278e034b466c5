"""Why a job waits, and how fast its bag goes: what the bag's page and the API say,
read from what the scheduler knows (its bags, queues, back-offs and VMs), never
changing it. Slurm's squeue and AWS Batch's console show a pending reason the same way.

`waiting_reasons` answers for a page of a bag's jobs (the bag's part worded once), for
each the first that holds: the bag is cancelling; the job is held for credit (and what
its account has against what an attempt needs); a budget holds the bag (held:
budget, controller/budgets.py); the executor could not take attempts
(backing off, until when); every VM type the bag may use is backed off after failed
launches; a VM is booting for the queue; the fleet is at `max_vms` with every VM busy;
else the next scheduling pass places it (a retry says which attempt it waits to make).

`bag_pace` is the bag's throughput over its last RECENT_ENDS job ends (succeeded or
failed): (n - 1) / (t_last - t_first) jobs a second, and the ETA of its open jobs at
that rate, open / rate; None until two jobs have ended at different times.
"""

from __future__ import annotations

from typing import Any

from controller.formatting import duration, number, plural
from controller.scheduler.loop import Scheduler
from controller.scheduler.runs import BagRun
from policies.packing import zone_allowed


def _types_of(s: Scheduler, bag: BagRun) -> list[str]:
    """The VM types that may run a job of the bag (allowed, in its regions, big enough)."""
    return [
        t.name
        for t in s.world.catalog_view
        if (bag.allowed_types is None or t.name in bag.allowed_types)
        and zone_allowed(t.zone, bag.regions)
        and bag.shape.fits_in(t.capacity)
    ]


def waiting_reason(s: Scheduler, bag_id: str, idx: int, now: float) -> str:
    """Why the job (queued or held) waits; '' when the scheduler does not hold its bag."""
    return waiting_reasons(s, bag_id, [idx], now)[idx]


def waiting_reasons(s: Scheduler, bag_id: str, idxs: list[int], now: float) -> dict[int, str]:
    """Why each of a bag's waiting jobs `idxs` waits (a page of them: what the bag's
    state says is worded once, then each job is only looked up)."""
    bag = s.world.bags.get(bag_id)
    if bag is None:
        why = "being admitted" if bag_id in s._handing_over else ""
        return dict.fromkeys(idxs, why)
    if bag.cancel_requested:
        return dict.fromkeys(idxs, "not started: the bag is being cancelled")
    held = _held_text(s, bag) if any(idx in bag.held for idx in idxs) else ""
    budget = s.budgets.held.get(bag_id)
    if budget is not None:  # controller/budgets.py
        queued = (
            (
                f"held: budget: {budget.why} (a larger budget lets it go on: "
                f"spotbag bags set {bag_id} --budget USD)"
            )
            .replace("{", "{{")
            .replace("}", "}}")
        )  # formatted below with its {retry} slot
    else:
        queued = _queued_text(s, bag, now)
    reasons = {}
    for idx in idxs:
        if idx in bag.held:
            reasons[idx] = held
            continue
        job = s.world.jobs.get((bag_id, idx))
        retry = (
            f"to retry (attempt {job.attempts + 1}) " if job is not None and job.attempts else ""
        )
        reasons[idx] = queued.format(retry=retry)
    return reasons


def _held_text(s: Scheduler, bag: BagRun) -> str:
    account = bag.spec.account
    available = max(0.0, s.accounts.ledger.balance(account).available)
    needed = s.accounts.per_attempt_cpu_h(bag.spec)
    return (
        f"held for credit: an attempt needs {number(needed)} CPU-hours and account "
        f"{account!r} has {number(available)} available (a credit releases it)"
    )


def _queued_text(s: Scheduler, bag: BagRun, now: float) -> str:
    """Why a queued job of the bag waits, with a {retry} slot for what is said of a retry."""
    if now < s.backoff.starts_blocked_until:
        return (
            f"backing off: the {s.executor.name} executor could not take attempts; "
            f"next try in {duration(s.backoff.starts_blocked_until - now)}"
        )
    types = _types_of(s, bag)
    blocked = {t: until for t, until in s.backoff.blocked_types().items() if until > now}
    if types and all(t in blocked for t in types):
        soonest = min(blocked[t] for t in types)
        return (
            f"backing off: launches of {', '.join(types)} failed; "
            f"next try in {duration(soonest - now)}"
        )
    if s.world.pending:
        return f"waiting {{retry}}for a VM to boot ({plural(len(s.world.pending), 'VM')} starting)"
    alive = len(s.world.vms) - len(s.world.pool_vms)
    if alive >= s.settings.max_vms:
        return (
            f"waiting {{retry}}for a free slot: the fleet is at max_vms = {s.settings.max_vms} "
            "and its VMs are busy"
        )
    return "waiting {retry}for the next scheduling pass to place it"


def bag_pace(s: Scheduler, bag_id: str, now: float) -> dict[str, Any] | None:
    """The bag's recent throughput (jobs per hour) and the ETA of its open jobs, or None
    (the bag is not open, or fewer than two of its jobs ended at different times)."""
    bag = s.world.bags.get(bag_id)
    if bag is None or len(bag.recent_ends) < 2:
        return None
    first, last = bag.recent_ends[0], bag.recent_ends[-1]
    if last <= first:
        return None
    per_s = (len(bag.recent_ends) - 1) / (last - first)
    return {
        "jobs_per_hour": per_s * 3600.0,
        "over_jobs": len(bag.recent_ends),
        "open_jobs": bag.open_jobs,
        "eta_s": bag.open_jobs / per_s,
        "as_of": now,
    }
