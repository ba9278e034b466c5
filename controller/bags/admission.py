"""Admitting a bag: validate, check that some VM type can run it, expand it into
jobs, persist bag and jobs in one transaction, and hand it to the scheduler.

Shared by the HTTP API and `spotbag simulate`, so both accept exactly the same bags.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.bags.spec import Bag, BagSpecError, FieldProblem, parse_bag
from controller.bags.waiting_jobs import PackedParams
from controller.errors import (
    ApiError,
    Conflict,
    InsufficientBalance,
    InvalidBag,
    NotFound,
    NoVmTypeFits,
)
from controller.ledger import Admission, UnknownAccount, first_attempt_keys
from controller.planner import CatalogType, why_unplaceable
from controller.scheduler import Scheduler
from controller.scheduler.runs import capacity_of, shape_of
from controller.store import IdempotencyConflict, Store
from controller.store.rows import BagRow
from drivers.base import VmType
from policies.ledger_rules import InsufficientCredit, jobs_covered


@dataclass(frozen=True)
class Expanded:
    bag: Bag
    params_json: PackedParams  # each job's parameters, compact JSON
    keys: Sequence[str]  # each job's first-attempt reservation key (made as read)


WorkdirCheck = Callable[[str], str | None]
JobUserCheck = Callable[[str], str | None]  # why an account's jobs could not run, or None

# Reservations opened per slice after a bag is written (~10 ms of the event loop).
OPEN_KEYS_CHUNK = 20_000


def expand(
    data: Any,
    catalog: Sequence[VmType],
    max_jobs: int,
    workdir_problem: WorkdirCheck | None = None,
    bag_id: str = "",
    job_user_problem: JobUserCheck | None = None,
) -> Expanded:
    """Validate and expand a decoded spec, with its jobs' first reservation keys
    (CPU-bound and may touch the file system, and the users' database: run it off the
    event loop). A bag whose account has no user its jobs may run as (executor
    run_as) is refused here, not at each of its attempts."""
    try:
        bag = parse_bag(data, max_jobs=max_jobs)
    except BagSpecError as exc:
        raise InvalidBag(str(exc), detail={"errors": [p.__dict__ for p in exc.problems]}) from None
    if job_user_problem is not None:
        problem = job_user_problem(bag.spec.account)
        if problem is not None:
            raise ApiError(
                f"account: {problem}",
                status=422,
                code="no_job_user",
                detail={"account": bag.spec.account},
            )
    if bag.spec.workdir is not None and workdir_problem is not None:
        problem = workdir_problem(bag.spec.workdir)
        if problem is not None:
            raise InvalidBag(
                f"workdir: {problem}", detail={"errors": [{"field": "workdir", "message": problem}]}
            )
    check_fits(bag, catalog)
    params_json = PackedParams.encode(bag.points())
    return Expanded(bag, params_json, first_attempt_keys(bag_id, len(params_json)))


def check_fits(bag: Bag, catalog: Sequence[VmType]) -> None:
    """Raise unless some allowed VM type can hold one job of the bag."""
    resources = bag.spec.resources
    known = {t.name for t in catalog}
    for i, name in enumerate(resources.vm_types or ()):
        if name not in known:
            problem = FieldProblem(
                f"resources.vm_types[{i}]",
                f"unknown VM type {name!r}; known: {', '.join(sorted(known))}",
            )
            raise InvalidBag(
                f"{problem.field}: {problem.message}", detail={"errors": [problem.__dict__]}
            )
    view = [CatalogType(t.name, t.zone, capacity_of(t), t.spot_price_per_hour) for t in catalog]
    reason = why_unplaceable(shape_of(bag.spec), resources.vm_types, resources.regions, view)
    if reason is not None:
        raise NoVmTypeFits(
            f"resources: {reason}",
            detail={
                "needed": {
                    "cpus": resources.cpus,
                    "gpus": resources.gpus,
                    "memory_gb": resources.memory_gb,
                },
                "available": [
                    {
                        "name": t.name,
                        "cpus": t.cpus,
                        "gpus": t.gpus,
                        "memory_gb": t.memory_gb,
                        "zone": t.zone,
                    }
                    for t in catalog
                ],
            },
        )


async def admit(
    data: Any,
    *,
    store: Store,
    scheduler: Scheduler,
    catalog: Sequence[VmType],
    bag_id: str,
    now: float,
    max_jobs: int,
    idempotency_key: str | None = None,
    offload: bool = True,
    workdir_problem: WorkdirCheck | None = None,
    job_user_problem: JobUserCheck | None = None,
) -> tuple[BagRow, bool]:
    """Admit a bag; returns (bag row, created). A repeated idempotency key returns the
    earlier bag and admits nothing, or raises Conflict when it named a different bag."""
    if offload:
        expanded = await asyncio.to_thread(
            expand, data, catalog, max_jobs, workdir_problem, bag_id, job_user_problem
        )
    else:
        expanded = expand(data, catalog, max_jobs, workdir_problem, bag_id, job_user_problem)
    spec = expanded.bag.spec
    deadline_at = spec.deadline_at(now)
    if deadline_at is not None and deadline_at <= now:
        message = f"{spec.deadline} has passed (it is now {_iso(now)})"
        raise InvalidBag(
            f"deadline: {message}",
            detail={"errors": [{"field": "deadline", "message": message}]},
        )
    row = {
        "id": bag_id,
        "account": spec.account,
        "name": spec.name,
        # Explicit points live in the jobs table; the stored spec stays small.
        "spec": spec.model_dump_json(exclude={"points"}),
        "state": "active",
        "job_count": expanded.bag.job_count,
        "created_at": now,
        # What the bag was: a retry with the same Idempotency-Key must be the same bag.
        "request_hash": hashlib.sha256(spec.model_dump_json().encode()).hexdigest(),
        # Its options as columns: a budget may be changed (PATCH), a duration is resolved.
        "deadline_at": deadline_at,
        "budget_usd": spec.budget_usd,
        "on_demand": spec.on_demand_mode,
        "deadline_confidence": spec.deadline_confidence,
    }
    job_count = expanded.bag.job_count
    # The balance is reserved now; the jobs' keys are opened once the bag is written.
    admission = reserve(scheduler, bag_id, spec, job_count, now, expanded.keys, open_keys=False)
    try:
        bag_row, created = await store.create_bag(
            row,
            expanded.params_json,
            idempotency_key,
            ledger_rows=admission.rows(now),
            held_from=admission.held_from,
            new_account=admission.new_account,
        )
    except IdempotencyConflict as exc:
        scheduler.accounts.undo(admission)
        raise Conflict(
            str(exc), code="idempotency_key_reused", detail={"bag_id": exc.bag_id}
        ) from None
    except BaseException:
        scheduler.accounts.undo(admission)
        raise
    if not created:
        scheduler.accounts.undo(admission)  # the earlier bag holds its own reservations
        return bag_row, created
    # The bag is written: it must reach the scheduler even if this request is
    # cancelled meanwhile (a client gone), so the hand-over runs shielded; a cancel of
    # the bag meanwhile is kept for it.
    scheduler.bag_written(bag_id)
    await asyncio.shield(
        hand_over(scheduler, bag_id, spec.model_copy(update={"points": None}), expanded, admission)
    )
    return bag_row, created


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="seconds")


async def hand_over(
    scheduler: Scheduler, bag_id: str, spec: Any, expanded: Expanded, admission: Admission
) -> None:
    """Open the written bag's reservations in the ledger, OPEN_KEYS_CHUNK keys at a
    time with the event loop free in between (a million keys at once would hold it
    for half a second), then give the bag to the scheduler. No attempt of the bag can
    settle before: the scheduler does not know it yet."""
    for start in range(0, len(admission.reserved_keys), OPEN_KEYS_CHUNK):
        scheduler.accounts.open_reserved(admission, start, start + OPEN_KEYS_CHUNK)
        await asyncio.sleep(0)
    scheduler.bag_admitted(bag_id, spec, expanded.params_json, admission.held_from)


def reserve(
    scheduler: Scheduler,
    bag_id: str,
    spec: Any,
    job_count: int,
    now: float,
    keys: Sequence[str] | None = None,
    *,
    open_keys: bool = True,
) -> Admission:
    """Reserve CPU-hours for the bag's jobs (docs/design.md#ledger), or say why not: what was needed,
    what is available, and what would help."""
    accounts = scheduler.accounts
    try:
        return accounts.admit_bag(bag_id, spec, job_count, now, keys, open_keys=open_keys)
    except UnknownAccount as exc:
        raise NotFound(str(exc), code="unknown_account", detail={"account": exc.account}) from None
    except InsufficientCredit as exc:
        per_job = accounts.per_attempt_cpu_h(spec)
        rate = accounts.rate(spec)
        affordable = jobs_covered(exc.available_cpu_h, per_job, job_count)
        raise InsufficientBalance(
            f"account {exc.account!r} cannot reserve CPU-hours for this bag: it needs "
            f"{exc.needed_cpu_h:,.2f} ({job_count:,} jobs × {rate:g} CPU-hours per hour × "
            f"max_runtime_s {spec.max_runtime_s:g} s) and has {max(0.0, exc.available_cpu_h):,.2f} "
            f"available. A shorter max_runtime_s, fewer jobs (it can cover {affordable:,}), "
            'more credit, or on_insufficient_balance: "hold" would help',
            detail={
                "account": exc.account,
                "needed_cpu_h": exc.needed_cpu_h,
                "available_cpu_h": max(0.0, exc.available_cpu_h),
                "per_job_cpu_h": per_job,
                "jobs_it_can_cover": affordable,
            },
        ) from None
