"""`spotbag checkpoint-plan`: when a job of a given length, started on a VM of a given
age, should checkpoint, by each policy, with each policy's expected overhead under
the VM type's preemption model (docs/design.md#checkpoints).

The optimal schedule comes from the same cached tables the daemon uses
(controller.preemption.checkpoint_tables); the others are evaluated exactly by
policies.checkpoint.expected_makespan.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.errors import SpotbagError
from controller.preemption.checkpoint_tables import TableCache
from controller.preemption.model_book import load_registry
from policies.checkpoint import CheckpointTable, Schedule, fixed_schedule, young_daly_schedule
from policies.checkpoint_notices import (
    Notices,
    build_notice_table,
    simulate_makespan_with_notices,
)
from policies.preemption import LifetimeModel
from policies.registry import ModelKey

_UNITS_H = {"d": 24.0, "h": 1.0, "m": 1 / 60, "min": 1 / 60, "s": 1 / 3600}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(d|h|min|m|s)")


class PlanError(SpotbagError, ValueError):
    """An argument that cannot be used; the message says which and why."""

    exit_code = 2


def parse_duration_h(text: str, what: str = "duration") -> float:
    """'5h', '90m', '1h30m', '45s', '1.5d' or a bare number of hours -> hours."""
    cleaned = text.strip().lower()
    try:
        return float(cleaned)
    except ValueError:
        pass
    position, total = 0, 0.0
    for match in _PART.finditer(cleaned):
        if cleaned[position : match.start()].strip():
            break
        total += float(match.group(1)) * _UNITS_H[match.group(2)]
        position = match.end()
    else:
        if position and not cleaned[position:].strip():
            return total
    raise PlanError(
        f"{what}: cannot read {text!r} as a duration; write e.g. 5h, 90m, 1h30m, 45s or 1.5d"
    )


def resolve_model(key_text: str, registry_path: str = "") -> tuple[LifetimeModel, str]:
    """The model of a registry key ('gce/n1-highcpu-16', most specific match) from the
    shipped registry or `registry_path`: (model, the key it was found under)."""
    registry = load_registry(registry_path)
    try:
        key = ModelKey.parse(key_text)
    except ValueError as exc:
        raise PlanError(f"--model: {exc}") from None
    entry = registry.entries.get(key)
    if entry is None:  # a zone with too few lifetimes of its own falls back to its region...
        entry = registry.lookup(key.provider, key.vm_type, key.zone)
        if entry is not None and (entry.key.provider, entry.key.vm_type) != (
            key.provider,
            key.vm_type,
        ):
            entry = None  # ... but another provider's or type's model is not this one's
    if entry is None:
        known = sorted({f"{k.provider}/{k.vm_type}" for k in registry.entries if k.provider != "*"})
        raise PlanError(
            f"--model: no model for {key_text!r} in the registry; known: {', '.join(known)} "
            "(optionally /zone/time-of-day/day)"
        )
    return entry.model, re.sub(r"(/\*)+$", "", entry.key.text())


@dataclass(frozen=True)
class PlanRequest:
    model: LifetimeModel
    model_key: str
    work_h: float
    delta_h: float
    start_age_h: float = 0.0
    restart_h: float = 0.0
    step_h: float = 1 / 60
    compare: tuple[str, ...] = ()  # "young-daly", "none", "periodic:<duration>"
    mttf_h: float | None = None  # for young-daly; None: the model's mean lifetime
    notices: Notices | None = None  # preemption notices to plan for (None: none)


def validate(request: PlanRequest) -> None:
    problems = []
    if not request.work_h > 0:
        problems.append("--work must be positive")
    if request.delta_h < 0:
        problems.append("--delta must not be negative")
    if not request.step_h > 0:
        problems.append("--step must be positive")
    if request.start_age_h < 0 or request.restart_h < 0:
        problems.append("--age and --restart must not be negative")
    if request.notices is not None and 0 < request.notices.lead_h < request.delta_h:
        problems.append(
            f"--notice {_clock(request.notices.lead_h)} is shorter than a checkpoint's write "
            f"(--delta {_clock(request.delta_h)}): such a notice saves nothing"
        )
    if request.mttf_h is not None and not request.mttf_h > 0:
        problems.append("--mttf must be positive")
    if request.work_h > 0 and request.step_h > 0 and request.work_h / request.step_h > 100_000:
        problems.append("--work / --step is over 100,000 steps: use a coarser --step")
    for policy in request.compare:
        if policy in ("young-daly", "none"):
            continue
        if policy.startswith("periodic:"):
            parse_duration_h(policy.removeprefix("periodic:"), "--compare periodic")
            continue
        problems.append(f"--compare {policy!r}: choose young-daly, none or periodic:<duration>")
    if problems:
        raise PlanError("; ".join(problems))


def plan(request: PlanRequest, tables: TableCache | None = None) -> list[Schedule]:
    """The optimal schedule first, then each compared policy."""
    validate(request)
    tables = tables or TableCache(
        None,
        step_h=request.step_h,
        restart_h=request.restart_h,
        max_work_h=max(24.0, request.work_h),
        inline=True,
    )
    m = request.model
    table = tables.lookup(m, request.delta_h, request.work_h)
    assert table is not None  # built above, inline
    schedules = [table.schedule(request.work_h, request.start_age_h)]
    if request.notices is not None and request.notices.useful(request.delta_h):
        schedules = _with_notices(request, table, request.notices)
    for policy in request.compare:
        if policy == "young-daly":
            schedules.append(
                young_daly_schedule(
                    m,
                    request.work_h,
                    request.delta_h,
                    request.mttf_h,
                    request.start_age_h,
                    request.restart_h,
                )
            )
        elif policy == "none":
            schedules.append(
                fixed_schedule(
                    m,
                    request.work_h,
                    request.work_h,
                    request.delta_h,
                    request.start_age_h,
                    request.restart_h,
                    "no checkpoints",
                )
            )
        else:
            period_h = parse_duration_h(policy.removeprefix("periodic:"))
            schedules.append(
                fixed_schedule(
                    m,
                    request.work_h,
                    period_h,
                    request.delta_h,
                    request.start_age_h,
                    request.restart_h,
                    f"every {_clock(period_h)}",
                )
            )
    return schedules


NOTICE_RUNS = 4000  # Monte Carlo runs that price the notice-less plan under notices


def _with_notices(request: PlanRequest, plain: CheckpointTable, notices: Notices) -> list[Schedule]:
    """The plan for notices (docs/design.md#checkpoint-notices) first, then the notice-less
    optimal plan with its expected makespan under the same notices (Monte Carlo): what
    planning for notices saves."""
    aware_table = build_notice_table(
        request.model, request.work_h, request.delta_h, notices, request.restart_h, request.step_h
    )
    aware = aware_table.schedule(request.work_h, request.start_age_h)
    share = f", {notices.share:.0%} of preemptions" if notices.share < 1 else ""
    label = f"optimal for {_clock(notices.lead_h)} notices{share}"
    schedules = [
        Schedule(aware.intervals_h, aware.expected_makespan_h, aware.work_h, aware.delta_h, label)
    ]
    rng = np.random.default_rng(0)  # a repeatable figure
    unaware = plain.schedule(request.work_h, request.start_age_h)
    mean_h, _, _ = simulate_makespan_with_notices(
        request.model,
        plain,
        aware.work_h,
        request.delta_h,
        notices,
        rng,
        request.restart_h,
        NOTICE_RUNS,
    )
    schedules.append(
        Schedule(
            unaware.intervals_h,
            mean_h,
            unaware.work_h,
            unaware.delta_h,
            f"optimal without notices, run with them ({NOTICE_RUNS:,} Monte Carlo runs from a "
            "fresh VM)",
        )
    )
    return schedules


def _clock(hours: float) -> str:
    """h:mm:ss."""
    seconds = round(hours * 3600)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}"


def as_dict(request: PlanRequest, schedules: list[Schedule]) -> dict:
    return {
        "model": {"key": request.model_key, "name": request.model.name, **request.model.parameters},
        "work_h": request.work_h,
        "delta_h": request.delta_h,
        "start_age_h": request.start_age_h,
        "restart_h": request.restart_h,
        "step_h": request.step_h,
        "notice_h": request.notices.lead_h if request.notices else 0.0,
        "notice_share": request.notices.share if request.notices else 0.0,
        "policies": [
            {
                "policy": s.policy,
                "checkpoints": s.checkpoints,
                "checkpoint_times_h": s.checkpoint_times_h(),
                "intervals_h": list(s.intervals_h),
                "expected_makespan_h": s.expected_makespan_h,
                "expected_overhead": s.overhead if math.isfinite(s.expected_makespan_h) else None,
            }
            for s in schedules
        ],
    }


def render(request: PlanRequest, schedules: list[Schedule]) -> str:
    """Plain text: a header, then per policy its overhead and checkpoint times."""
    lines = [
        f"{_clock(request.work_h)} of work on a {request.model_key} VM ({request.model.name}) "
        f"of age {request.start_age_h:g} h; a checkpoint takes {_clock(request.delta_h)}, "
        f"a restart {_clock(request.restart_h)}; grid {_clock(request.step_h)}"
        + (
            f"; notices {_clock(request.notices.lead_h)} ahead of "
            f"{request.notices.share:.0%} of preemptions"
            if request.notices
            else ""
        ),
    ]
    for s in schedules:
        finite = math.isfinite(s.expected_makespan_h)
        overhead = f"{100 * s.overhead:.2f}%" if finite else "never finishes"
        makespan = f"{s.expected_makespan_h:.3f} h" if finite else "inf"
        lines.append("")
        lines.append(
            f"{s.policy}: expected makespan {makespan}, overhead {overhead}, "
            f"{s.checkpoints} checkpoint(s)"
        )
        if s.checkpoints:
            times = ", ".join(_clock(t) for t in s.checkpoint_times_h())
            intervals = ", ".join(f"{60 * i:.3g}" for i in s.intervals_h)
            lines.append(f"  checkpoint at (h:mm:ss after the start, if nothing fails): {times}")
            lines.append(f"  minutes of work between checkpoints: {intervals}")
    return "\n".join(lines)


def write_plot(request: PlanRequest, schedules: list[Schedule], out: str | Path) -> None:
    from controller.tools.plots import plot_checkpoint_plan

    plot_checkpoint_plan(request.model, schedules, request.start_age_h, out)
