"""What `spotbag index` and `spotbag simulate-hopping` compute: the cloud index of a spot
price trace and what each hopping policy would have cost (docs/design.md#index-tracking). The math is
policies.index and policies.hopping; this module reads the trace (controller.traces.price_trace),
sizes its VM types (controller.traces.vm_size: a --types file, a --config catalog, the bundled
EC2 and GCE table) and runs them. The commands and their tables are
controller/cli/hopping.py; problems are `TraceError`, `PlanError` or `SizeSourceError`."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.errors import SpotbagError
from controller.tools.checkpoint_plan import PlanError, parse_duration_h
from controller.traces.price_trace import PriceTrace
from controller.traces.trace_io import TraceError
from controller.traces.vm_size import VmSize, bundled_sizes, catalog_sizes, read_sizes_file
from policies.hopping import Phase, Replay, replay, volatility
from policies.index import Policy, index_series, normalized_prices
from policies.registry import region_of

COMPOSITIONS = ("zone", "region", "family")
_JOB_PART = re.compile(r"^\s*([0-9.]+)\s*:\s*([0-9.]+)\s*(?::\s*(\S+))?\s*$")


class SizeSourceError(SpotbagError, ValueError):
    """A --types or --config file that cannot size the trace's types; `option` names it."""

    exit_code = 2

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.message = message


def instance_family(instance_type: str) -> str:
    """m5.large -> m5 (an EC2 instance type's family: the part before the dot)."""
    return instance_type.split(".", 1)[0]


def compositions(trace: PriceTrace, by: str) -> dict[str, np.ndarray]:
    """Composition name -> member mask over the trace's VMs: the one membership rule of
    the index, its table and its plot."""
    keys = []
    for vm_type, zone in trace.vms:
        if by == "zone":
            keys.append(zone)
        elif by == "region":
            keys.append(region_of(zone))
        else:
            keys.append(instance_family(vm_type))
    return {key: np.array([k == key for k in keys]) for key in sorted(set(keys))}


@dataclass
class IndexSummary:
    composition: str
    members: list[str]
    index_mean: float  # USD per hour per sqrt(vCPU·GB)
    index_cv: float  # coefficient of variation of the index
    members_cv_mean: float  # mean coefficient of variation of the members' normalised prices
    members_cv_max: float
    capped_share: float  # fraction of member prices at the cap, left out of the index

    @property
    def calmer_by(self) -> float:
        return self.members_cv_mean / self.index_cv if self.index_cv > 0 else math.inf


def summarize_index(
    trace: PriceTrace, by: str, step_s: float, sizes: dict[str, VmSize] | None = None
):
    """(times, {composition: index series}, normalised prices, [IndexSummary])."""
    fleet = trace.fleet(sizes)
    times, prices = trace.grid(step_s)
    normalized = normalized_prices(prices, fleet.cpus, fleet.memory_gb)
    series, summaries = {}, []
    for name, members in compositions(trace, by).items():
        index = index_series(prices, fleet.cpus, fleet.memory_gb, fleet.on_demand, members)
        series[name] = index
        cvs = [volatility(normalized[:, i]) for i in np.flatnonzero(members)]
        member_prices = prices[:, members]
        capped = member_prices >= 10 * fleet.on_demand[members] * (1 - 1e-9)
        summaries.append(
            IndexSummary(
                composition=name,
                members=[fleet.names[i] for i in np.flatnonzero(members)],
                index_mean=float(np.nanmean(index)),
                index_cv=volatility(index),
                members_cv_mean=float(np.mean(cvs)),
                members_cv_max=float(np.max(cvs)),
                capped_share=float(np.mean(capped[~np.isnan(member_prices)])),
            )
        )
    return times, series, normalized, summaries


def parse_job(text: str) -> list[Phase]:
    """'2:10' (2 vCPUs, 10 GB, until the trace ends) or phases '4:16:30m,2:8:30m'."""
    phases = []
    parts = text.split(",")
    for n, part in enumerate(parts):
        match = _JOB_PART.fullmatch(part)
        if not match:
            raise PlanError(
                f"--job: cannot read {part!r}; write CPUS:GB (runs to the end) or "
                "CPUS:GB:DURATION phases separated by commas, e.g. 4:16:30m,2:8:30m"
            )
        cpus, memory_gb = float(match.group(1)), float(match.group(2))
        if match.group(3):
            work_h = parse_duration_h(match.group(3), "--job duration")
        elif n == len(parts) - 1:
            work_h = math.inf
        else:
            raise PlanError(f"--job: phase {part!r} needs a duration (only the last may run on)")
        if cpus <= 0 or memory_gb <= 0 or work_h <= 0:
            raise PlanError(f"--job: phase {part!r}: cpus, GB and duration must be > 0")
        phases.append(Phase(work_h, cpus, memory_gb))
    return phases


def replay_trace(
    trace: PriceTrace,
    policies: Sequence[Policy],
    phases: Sequence[Phase],
    *,
    step_s: float,
    window_s: float,
    decide_every_s: float,
    migration_s: float,
    revocation_s: float,
    bid_factor: float = 1.0,
    literal_trigger: bool = False,
    sizes: dict[str, VmSize] | None = None,
) -> list[Replay]:
    fleet = trace.fleet(sizes, bid_factor=bid_factor)
    if np.isnan(fleet.on_demand).any():
        raise TraceError("the trace has no on-demand price for some VMs (ondemand_price_usd_hr)")
    # From the first moment every VM has a price: a policy choosing before then would
    # choose among the few VMs whose history happens to start first.
    _, prices = trace.grid(step_s, start_s=trace.common_start_s)
    return [
        replay(
            prices,
            step_s / 3600,
            fleet,
            phases,
            policy,
            window_steps=max(1, round(window_s / step_s)),
            decide_every=max(1, round(decide_every_s / step_s)),
            migration_h=migration_s / 3600,
            revocation_h=revocation_s / 3600,
            literal_trigger=literal_trigger,
        )
        for policy in policies
    ]


def seconds(text: str, what: str) -> float:
    """A duration option (5m, 1d, 90s, ...) in seconds; PlanError names `what`."""
    return parse_duration_h(text, what) * 3600


def size_table(types_path: str | None, config_path: str | None) -> dict[str, VmSize]:
    """The sizes a trace's types are looked up in: the --types file first, then the
    --config catalog, then the bundled EC2 and GCE table."""
    sizes = bundled_sizes()
    if config_path:
        from controller.config import ConfigError, load_config  # pydantic: only for --config

        try:
            sizes |= catalog_sizes(load_config(config_path).vm_types)
        except ConfigError as exc:
            raise SizeSourceError("--config", str(exc)) from None
    if types_path:
        if not Path(types_path).is_file():
            raise SizeSourceError(
                "--types",
                f"{types_path}: no such file. --types takes a file of VM sizes (CSV or JSON: "
                "name, vcpus, memory_gb); to keep only some types of the trace, use --only-types",
            )
        try:
            sizes |= read_sizes_file(types_path)
        except TraceError as exc:
            raise SizeSourceError("--types", str(exc)) from None
    return sizes


def replay_row(result: Replay) -> dict:
    return {
        "policy": result.policy,
        "cost_usd": result.cost_usd,
        "normalized_cost": result.normalized_cost,
        "availability": result.availability,
        "migrations": result.migrations,
        "revocations": result.revocations,
        "waiting_h": result.waiting_h,
        "work_h": result.work_h,
        "wall_h": result.wall_h,
        "finished": result.finished,
    }
