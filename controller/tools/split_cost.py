"""`spotbag split-cost FILE.json`: split one VM's cost among the jobs that shared it
(docs/design.md#cost-reports, `policies.allocation`), from a JSON description of the VM and its jobs.

The command is `controller.cli.offline.split_cost_command`; it runs offline (no
daemon). A file that is missing, not JSON, or has a field missing or wrong is an
`InputError` naming the field by its path in the file, e.g. `jobs[1].reserved.cpus`
(the command prints it and exits 2).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.errors import SpotbagError
from policies.allocation import DEFAULT_WEIGHTS, RESOURCES, CostSplit, Weights, split_costs

# The file's names for the resources, in `policies.allocation.RESOURCES` order.
FIELDS = ("cpus", "memory_gb", "gpus")
VM_FIELDS = (*FIELDS, "cost_usd", "hours")
JOB_FIELDS = ("id", "reserved", "used")

INPUT_FORMAT = """\b
FILE.json ('-': standard input):
  {"vm": {"cpus": 16, "memory_gb": 64, "gpus": 1, "cost_usd": 2.98, "hours": 1},
   "weights": {"gpu": 9, "cpu": 0.9, "memory": 0.1},
   "jobs": [{"id": "a", "reserved": {"cpus": 4, "memory_gb": 16, "gpus": 1},
             "used": {"cpus": 3.5, "memory_gb": 20}}, ...]}
\b
  vm.cpus, vm.memory_gb, vm.cost_usd    required; vm.gpus default 0
  vm.cost_usd   what the VM cost over the period (not an hourly price)
  vm.hours      the period's length, default 1 (for the per-hour prices)
  weights       optional, each default as shown (only their ratios matter)
  jobs[].id     required, unique
  jobs[].reserved.*   amounts the job reserved, each default 0
  jobs[].used.*       amounts it used (average over the period); a missing
                      or null one is not measured: the reservation counts
All numbers are >= 0. A job's allocation of a resource is max(reserved, used)."""


class InputError(SpotbagError):
    """A problem with the input, at `path` in the file (dotted, with [i] for lists)."""

    exit_code = 2

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path
        self.message = message


@dataclass(frozen=True)
class SplitCostInput:
    capacity: np.ndarray  # (R,) in RESOURCES order
    cost_usd: float
    hours: float
    weights: Weights
    job_ids: list[str]
    reserved: np.ndarray  # (J, R)
    used: np.ndarray  # (J, R), NaN where not measured


def parse_input(data: Any) -> SplitCostInput:
    """Check and convert the decoded JSON; raise InputError naming the first bad field."""
    root = _object(data, "", ("vm", "weights", "jobs"))
    vm = _object(_required(root, "vm", ""), "vm", VM_FIELDS)
    for field in ("cpus", "memory_gb", "cost_usd"):
        _required(vm, field, "vm")
    capacity = np.array([_number(vm.get(field, 0), f"vm.{field}") for field in FIELDS])
    cost = _number(vm["cost_usd"], "vm.cost_usd")
    hours = _number(vm.get("hours", 1), "vm.hours")
    if hours == 0:
        raise InputError("vm.hours", "must be more than 0")

    raw_weights = _object(root.get("weights", {}), "weights", RESOURCES)
    weights = Weights(
        **{
            name: _number(raw_weights.get(name, getattr(DEFAULT_WEIGHTS, name)), f"weights.{name}")
            for name in RESOURCES
        }
    )
    if not np.any(capacity * weights.as_array() > 0):
        raise InputError(
            "vm",
            "nothing to split the cost by: no resource has both capacity and a weight above 0",
        )

    jobs = _required(root, "jobs", "")
    if not isinstance(jobs, list):
        raise InputError("jobs", f"must be a list, got {_describe(jobs)}")
    ids: list[str] = []
    seen: dict[str, int] = {}
    reserved = np.zeros((len(jobs), len(FIELDS)))
    used = np.full((len(jobs), len(FIELDS)), np.nan)
    for i, raw_job in enumerate(jobs):
        where = f"jobs[{i}]"
        job = _object(raw_job, where, JOB_FIELDS)
        job_id = _required(job, "id", where)
        if not isinstance(job_id, str) or not job_id:
            raise InputError(f"{where}.id", f"must be a non-empty string, got {_describe(job_id)}")
        if job_id in seen:
            raise InputError(f"{where}.id", f"duplicate id {job_id!r} (also jobs[{seen[job_id]}])")
        seen[job_id] = i
        ids.append(job_id)
        amounts = _object(_required(job, "reserved", where), f"{where}.reserved", FIELDS)
        for r, field in enumerate(FIELDS):
            reserved[i, r] = _number(amounts.get(field, 0), f"{where}.reserved.{field}")
        measured = job.get("used")
        if measured is None:
            continue
        measured = _object(measured, f"{where}.used", FIELDS)
        for r, field in enumerate(FIELDS):
            if measured.get(field) is not None:
                used[i, r] = _number(measured[field], f"{where}.used.{field}")
    return SplitCostInput(capacity, cost, hours, weights, ids, reserved, used)


def load_input(path: str) -> SplitCostInput:
    """Read and check FILE ('-': standard input); InputError on any problem."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as exc:
        raise InputError("", f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise InputError("", f"not JSON (not UTF-8 text: {exc.reason})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            "", f"not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    return parse_input(data)


def compute(request: SplitCostInput) -> CostSplit:
    return split_costs(
        request.capacity, request.cost_usd, request.reserved, request.used, request.weights
    )


def as_dict(request: SplitCostInput, result: CostSplit) -> dict[str, Any]:
    """The report as JSON-ready data; every job's total_cost_usd plus
    unallocated_cost_usd make total_cost_usd: vm.cost_usd, to rounding (~1e-16)."""
    job_costs = result.job_cost
    unallocated = float(result.unallocated)
    jobs = [
        {
            "id": job_id,
            "allocated": _by_field(result.allocated[j]),
            "split_cost_usd": float(result.split[j]),
            "unused_cost_usd": float(result.unused_share[j]),
            "total_cost_usd": float(job_costs[j]),
            "split_cost_by_resource_usd": _by_field(result.split_by_resource[j]),
            "unused_cost_by_resource_usd": _by_field(result.unused_share_by_resource[j]),
        }
        for j, job_id in enumerate(request.job_ids)
    ]
    resources = {
        field: {
            "capacity": float(request.capacity[r]),
            "allocated": float(result.allocated[:, r].sum()),
            "total": float(result.total[r]),
            "unused_ratio": float(result.unused_ratio[r]),
            "price_usd": float(result.price[r]),
            "price_per_hour_usd": float(result.price[r]) / request.hours,
            "cost_usd": float(result.resource_cost[r]),
            "unused_cost_usd": float(result.unused_cost[r]),
        }
        for r, field in enumerate(FIELDS)
    }
    return {
        "vm": {
            **_by_field(request.capacity),
            "cost_usd": request.cost_usd,
            "hours": request.hours,
        },
        "weights": {name: getattr(request.weights, name) for name in RESOURCES},
        "unit_cost_usd": float(result.unit_cost),
        "resources": resources,
        "jobs": jobs,
        "unallocated_cost_usd": unallocated,
        "total_cost_usd": math.fsum([*map(float, job_costs), unallocated]),
    }


# --- checking the input ------------------------------------------------------------------


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return repr(value)


def _object(value: Any, path: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InputError(path, f"must be a JSON object, got {_describe(value)}")
    for key in value:
        if key not in allowed:
            where = f"{path}.{key}" if path else key
            raise InputError(where, f"unknown field (expected one of: {', '.join(allowed)})")
    return value


def _required(container: dict[str, Any], key: str, path: str) -> Any:
    if key not in container:
        raise InputError(f"{path}.{key}" if path else key, "required field missing")
    return container[key]


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(path, f"must be a number, got {_describe(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputError(path, f"must be a finite number, got {value}")
    if number < 0:
        raise InputError(path, f"must not be negative, got {value}")
    return number


# --- the JSON answer -----------------------------------------------------------------------


def _by_field(values: np.ndarray) -> dict[str, float]:
    return {field: float(values[r]) for r, field in enumerate(FIELDS)}
