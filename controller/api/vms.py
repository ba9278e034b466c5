"""VMs: the fleet with what each VM has cost so far (priced as reports price it:
controller/costs/fleet_cost.py), the preemption models the
scheduler assumes (configured, learned, in use per live VM), and fault injection
(preempt a VM now, on drivers that can)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from aiohttp import web

from controller.api.base import (
    BOOLEAN,
    ERR,
    Param,
    Route,
    bool_query,
    bounded,
    controller_of,
    enum_query,
    int_param,
    json_response,
)
from controller.api.schemas import Models, Preempted, Recommended, VmList
from controller.costs.summary import fleet_view
from controller.errors import Conflict, NotFound
from drivers.base import VmState

VMS_LIMIT = bounded("limit", "At most this many VMs.", 1, 10_000, 200)
NOTICE_S = bounded(
    "notice_s",
    "Give a preemption notice this many seconds (of the driver's clock) ahead, as the "
    "clouds do (EC2 120, GCE 30); 0 (default): preempt now.",
    0,
    3600,
    0,
)


async def list_vms(request: web.Request) -> web.Response:
    c = controller_of(request)
    state = enum_query(request, "state", [s.value for s in VmState])
    limit = int_param(request, VMS_LIMIT)
    include_ended = bool_query(request, "all")
    states = [state] if state else None
    if state is None and not include_ended:
        states = [VmState.PENDING.value, VmState.RUNNING.value]
    live = c.running_scheduler.world.vms
    fleet = await c.fleet_costs.get()
    vms: list[dict[str, Any]] = []
    for row in await c.store.list_vms(states=states, limit=limit):
        vm: dict[str, Any] = dict(row)
        vm["on_demand"] = not vm["spot"]  # the store's `spot` column records the market
        vms.append(vm)
        # What the VM has cost up to the fleet's instant, as reports price it (a VM not
        # yet running then has cost nothing so far).
        cost = fleet.vms.get(vm["id"])
        vm["billed_hours"] = cost.billed_hours if cost else 0.0
        vm["cost_usd"] = cost.cost_usd if cost else 0.0
        vm["on_demand_cost_usd"] = cost.on_demand_cost_usd if cost else 0.0
        run = live.get(vm["id"])
        vm["jobs"] = len(run.attempts) if run is not None else 0
        # Its Slurm node: a pool node it serves, or the node named after it.
        names = c.node_names
        vm["slurm_node"] = vm["pool_node"] or (names.node_of(vm["id"]) if names else "")
        vm["terminating"] = bool(run and run.terminating)
    return json_response({"vms": vms, "usage": fleet_view(fleet)})


CURVE_POINTS = 240  # points of each model's S(t) and h(t) for the web page's charts


def _vm_model_view(vm: Any, now: float, time_scale: float) -> dict[str, Any]:
    """The preemption model the scheduler assumes for a live VM, at its current age:
    how likely it was to live this long and how long it is expected to live on."""
    age_h = max(0.0, now - vm.requested_at) * time_scale / 3600.0
    belief = vm.belief
    remaining_h = float(belief.model.mean_residual_life_h(age_h)) if belief else None
    return {
        "survival": float(belief.model.sf(age_h)) if belief else None,
        "expected_remaining_h": _finite(remaining_h) if remaining_h is not None else None,
        "vm_id": vm.id,
        "vm_type": vm.vm_type.name,
        "zone": vm.zone,
        "age_h": age_h,
        "model": belief.model.name if belief else None,
        "parameters": belief.model.parameters if belief else None,
        "key": belief.key if belief else None,
        "source": belief.source if belief else None,
        "stable": vm.table.is_stable(age_h) if vm.table else None,
    }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _model_curves(vms: list[Any], views: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model key in use: S(t) and h(t) on an even grid up to the model's drawing
    horizon (policies/preemption.py), so that pages draw the curve and compute none."""
    curves: dict[str, dict[str, Any]] = {}
    oldest: dict[str, float] = {}
    models: dict[str, Any] = {}
    for vm, view in zip(vms, views, strict=True):
        if vm.belief is None:
            continue
        key = view["key"]
        models[key] = vm.belief.model
        oldest[key] = max(oldest.get(key, 0.0), view["age_h"])
    for key, model in models.items():
        ages = np.linspace(0.0, model.drawing_horizon_h(oldest[key]), CURVE_POINTS + 1)
        curves[key] = {
            "model": model.name,
            "age_h": ages.tolist(),
            "survival": model.sf(ages).tolist(),
            "hazard": [_finite(h) for h in model.hazard(ages).tolist()],
        }
    return curves


async def list_models(request: web.Request) -> web.Response:
    c = controller_of(request)
    settings = c.config.preemption
    now = c.clock.now()
    learned = await c.store.models(active_only=request.query.get("history") is None)
    live = list(c.running_scheduler.world.vms.values())
    in_use = [_vm_model_view(vm, now, c.config.driver.time_scale) for vm in live]
    return json_response(
        {
            "configured": {
                "model": settings.model,
                "reuse_policy": settings.reuse_policy,
                "min_samples": settings.min_samples,
                "learn": settings.learn,
                "shipped_models": len(c.book.defaults.entries),
            },
            "learned": learned,
            "in_use": in_use,
            "curves": _model_curves(live, in_use),
        }
    )


def still_launching(vm_id: str) -> str:
    """A VM the daemon tracks whose provider id its driver has not reported yet (the
    launch answered, or its first status is on its way): it cannot be named to the
    driver yet. Not "not alive": a job may already run on it."""
    return f"VM {vm_id} is still being launched (its driver has not reported it yet): try again"


async def preempt_vm(request: web.Request) -> web.Response:
    c = controller_of(request)
    vm_id = request.match_info["vm_id"]
    notice_s = int_param(request, NOTICE_S)
    injector = c.injector
    if injector is None:
        raise Conflict(f"the {c.driver.name} driver cannot inject preemptions")
    vm = c.running_scheduler.world.vms.get(vm_id)
    if vm is None:
        raise NotFound(f"VM {vm_id} is not alive")
    if not vm.provider_id:
        raise Conflict(still_launching(vm_id))
    if not injector.inject_preemption(
        vm.provider_id, "preempted: injected through the API", notice_s=notice_s
    ):
        raise Conflict(f"VM {vm_id} is not alive, or on-demand (never preempted)")
    return json_response({"id": vm_id, "preempted": True}, status=202)


async def rebalance_vm(request: web.Request) -> web.Response:
    c = controller_of(request)
    vm_id = request.match_info["vm_id"]
    inject = getattr(c.injector, "inject_rebalance", None)
    if inject is None:
        raise Conflict(f"the {c.driver.name} driver cannot give rebalance recommendations")
    vm = c.running_scheduler.world.vms.get(vm_id)
    if vm is None:
        raise NotFound(f"VM {vm_id} is not alive")
    if not vm.provider_id:
        raise Conflict(still_launching(vm_id))
    if not inject(vm.provider_id):
        raise Conflict(f"VM {vm_id} is not alive, or has no metadata server to tell it")
    return json_response({"id": vm_id, "recommended": True}, status=202)


ROUTES: tuple[Route, ...] = (
    Route(
        "GET",
        "/v1/vms",
        list_vms,
        "VMs (live ones unless state or all=true) and fleet usage.",
        admin_only=True,
        params=(
            Param(
                "state", "query", "Only VMs in this state.", {"enum": [s.value for s in VmState]}
            ),
            Param("all", "query", "true: include ended VMs (default false).", BOOLEAN),
            VMS_LIMIT,
        ),
        responses={200: ("VMs and usage totals.", VmList)},
    ),
    Route(
        "GET",
        "/v1/models",
        list_models,
        "Preemption models: configured, learned (sample counts and fit quality) and in use per VM.",
        admin_only=True,
        params=(Param("history", "query", "Present: also the learned models since replaced."),),
        responses={200: ("Models.", Models)},
    ),
    Route(
        "POST",
        "/v1/vms/{vm_id}/preempt",
        preempt_vm,
        "Preempt a VM now (fault injection; local driver only).",
        admin_only=True,
        params=(Param("vm_id", "path", "VM id (vm-...).", required=True), NOTICE_S),
        responses={
            202: ("The VM was preempted.", Preempted),
            404: ("No such live VM.", ERR),
            409: ("The driver cannot inject preemptions.", ERR),
        },
    ),
    Route(
        "POST",
        "/v1/vms/{vm_id}/rebalance",
        rebalance_vm,
        "Give a VM EC2's rebalance recommendation (at elevated risk, not preempted), which "
        "only its metadata server tells (fault injection; local driver with VM hosts only).",
        admin_only=True,
        params=(Param("vm_id", "path", "VM id (vm-...).", required=True),),
        responses={
            202: ("The VM's metadata server recommends a rebalance.", Recommended),
            404: ("No such live VM.", ERR),
            409: ("The driver cannot give recommendations, or the VM has no metadata server.", ERR),
        },
    ),
)
