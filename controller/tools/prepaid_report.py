"""What `spotbag prepaid` computes (the command is controller/cli/prepaid.py): how many
cores of a type to prepay (reserve) for a term, and what that saves against buying
every core-hour on demand (docs/design.md#cost-reports).

The usage comes from a history of (start, end, cores) intervals:

- `--swf FILE`: a Standard Workload Format trace, gzipped or not (controller.traces.trace_io
  reads it: ';' lines are the header, 18 whitespace-separated fields per job, -1 is
  missing). A job runs from submit + wait (fields 2 + 3) for its run time (field 4)
  on its allocated processors (field 5). An unknown wait means the job started when
  submitted; unknown allocated processors are the requested ones (field 8). Jobs
  with an unknown submit time, run time or processor count, or no processors, are
  skipped and counted per reason; a trace with none left is an error. Times are
  seconds after the header's UnixStartTime.
- `--csv FILE`: a header row naming at least the columns start, end and cores
  (more columns are allowed: `--core-type COLUMN` groups by one of them), gzipped
  or not. Times are epoch seconds (e.g. 1583160579) or ISO 8601 (2020-03-02T14:49:39Z;
  no zone means UTC); cores are whole numbers >= 0. A bad row is an error; so is a
  file without rows.
- `--from-store`: the VMs a state directory's daemon ran: each VM's vCPUs from
  running to ended, the VM type as the core type (prepaid capacity is bought as VMs).

The period analysed is the span of the history, from the first start to the last
end (shared by every core type). Each prepaid core is paid for every hour of that
span at the prepaid price per core-hour; the term (1y/3y) only converts
`--prepaid-upfront`, an amount per core for the whole term, to that hourly price
(upfront / (8760·years)). A span shorter than the term stands for the whole term:
the optimum assumes the rest of the term looks like it.

The math is policies.prepaid; this module reads the inputs and reports. Problems with
an input are `PrepaidError`s naming the option at fault (TraceError from the readers).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from controller.errors import SpotbagError
from controller.formatting import percent, usd
from controller.traces import trace_io
from controller.traces.trace_io import TraceError, parse_time
from policies.prepaid import (
    PrepaidOptimum,
    break_even_utilisation,
    optimal_by_core_type,
    prepaid_hourly_price,
)

TERMS_Y = {"1y": 1, "3y": 3}
# SWF fields (1-based) a core type may be taken from.
SWF_CORE_TYPES = {"partition": 16, "queue": 15}
CSV_COLUMNS = ("start", "end", "cores")
DEFAULT_CURVE_POINTS = 15


class PrepaidError(SpotbagError, ValueError):
    """A usage source that cannot be analysed; `option` names the command-line option
    it came from (the CLI reports it as a bad value of that option, exit 2)."""

    exit_code = 2

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option
        self.message = message


class CoreTypeError(TraceError):
    """--core-type names nothing the input has."""


@dataclass
class Intervals:
    """A usage history: epoch seconds (or seconds of a trace without a start time)."""

    starts: np.ndarray
    ends: np.ndarray
    cores: np.ndarray
    core_types: np.ndarray | None
    source: str  # "SWF path", "CSV path"
    label: str  # the file's name, for titles
    absolute: bool = True  # times are epoch seconds, so they can be shown as dates
    skipped: int = 0
    notes: list[str] = field(default_factory=list)
    skipped_by_reason: dict[str, int] = field(default_factory=dict)


# --- readers ---------------------------------------------------------------------------


def _swf_skips(submit, wait, run, procs) -> list[tuple[str, np.ndarray]]:
    """(reason, mask) in order: a job is counted under the first reason that applies."""
    negative = np.zeros(submit.shape, dtype=bool)
    for values in (submit, wait, run, procs):
        negative |= np.nan_to_num(values, nan=0.0) < 0
    return [
        ("unknown (-1) submit time", np.isnan(submit)),
        ("unknown (-1) run time", np.isnan(run)),
        ("unknown (-1) allocated and requested processors", np.isnan(procs)),
        ("negative submit time, wait, run time or processors (not -1)", negative),
        ("no processors (0 allocated)", procs == 0),
    ]


def read_swf(path: str | Path, core_type: str | None = None) -> Intervals:
    """The jobs of an SWF trace (gzip or not) as intervals; `core_type` 'partition' or
    'queue' groups them by that field (names from the header's 'Partition:' and
    'Queue:' lines).

    A job runs from submit + wait for its run time on its allocated processors. An
    unknown (-1) wait means it started when submitted; unknown allocated processors
    are taken from the requested ones (field 8). Jobs with no submit time, run time or
    processors are skipped and counted per reason; a trace with no job left is an
    error."""
    if core_type is not None and core_type not in SWF_CORE_TYPES:
        raise CoreTypeError(
            f"{path}: an SWF trace has no core type {core_type!r}; choose "
            f"{' or '.join(SWF_CORE_TYPES)}"
        )
    trace = trace_io.read_swf(path)
    submit, wait, run = (trace.column(n) for n in ("submit_s", "wait_s", "run_s"))
    allocated, requested = trace.column("allocated_procs"), trace.column("requested_procs")
    procs = np.where(np.isnan(allocated), requested, allocated)
    skipped = trace_io.Skipped("job")
    keep = np.ones(len(trace), dtype=bool)
    for reason, mask in _swf_skips(submit, wait, run, procs):
        skipped.add(reason, int(np.count_nonzero(mask & keep)))
        keep &= ~mask
    skipped.require_kept(int(np.count_nonzero(keep)), path)
    fractional = keep & (procs != np.round(procs))
    if fractional.any():
        at = int(np.argmax(fractional))
        raise TraceError(
            f"{path}:{trace.lines[at]}: processors must be a whole number, not {procs[at]:g}"
        )
    started = submit + np.nan_to_num(wait, nan=0.0)
    notes = skipped.notes()
    unknown_wait = int(np.count_nonzero(keep & np.isnan(wait)))
    if unknown_wait:
        notes.append(
            f"{unknown_wait:,} job(s) with unknown (-1) wait: taken to start at their submit time"
        )
    from_requested = int(np.count_nonzero(keep & np.isnan(allocated)))
    if from_requested:
        notes.append(
            f"{from_requested:,} job(s) with unknown (-1) allocated processors: their "
            "requested processors (field 8) used"
        )
    labels = None
    if core_type is not None:
        names = trace.names[core_type]
        labels = np.array(
            [
                f"{core_type} {names.get(str(int(v)), str(int(v))) if np.isfinite(v) else 'unknown'}"
                for v in trace.column(core_type)[keep]
            ],
            dtype=str,
        )
    offset = trace.unix_start_s or 0.0
    return Intervals(
        started[keep] + offset,
        started[keep] + run[keep] + offset,
        procs[keep].astype(np.int64),
        labels,
        f"SWF {path}",
        Path(path).name,
        absolute=trace.unix_start_s is not None,
        skipped=skipped.total,
        notes=notes,
        skipped_by_reason=skipped.by_reason(),
    )


def read_csv(path: str | Path, core_type: str | None = None) -> Intervals:
    """Intervals from a CSV (gzip or not) with a header row: start, end, cores (and
    `core_type`). A bad row is an error naming its line; so is a file without rows."""
    starts: list[float] = []
    ends: list[float] = []
    cores: list[int] = []
    types: list[str] = []
    with trace_io.csv_records(path, CSV_COLUMNS) as table:
        if core_type is not None and core_type not in table.header:
            raise CoreTypeError(
                f"{path}:1: no core-type column {core_type!r} (columns: {', '.join(table.header)})"
            )
        for number, row in table:
            try:
                start = parse_time(row["start"])
                end = parse_time(row["end"])
            except ValueError as exc:
                raise TraceError(f"{path}:{number}: {exc}") from None
            if end < start:
                raise TraceError(f"{path}:{number}: end {row['end']!r} is before start")
            text = row["cores"]
            try:
                count = float(text)
            except ValueError:
                count = math.nan
            if not (math.isfinite(count) and count >= 0 and count == int(count)):
                raise TraceError(
                    f"{path}:{number}: cores must be a whole number >= 0, not {text!r}"
                )
            starts.append(start)
            ends.append(end)
            cores.append(int(count))
            if core_type is not None:
                types.append(row[core_type] or "(none)")
    trace_io.Skipped("interval").require_kept(len(starts), path)
    return Intervals(
        np.asarray(starts, dtype=float),
        np.asarray(ends, dtype=float),
        np.asarray(cores, dtype=np.int64),
        np.array(types, dtype=str) if core_type is not None else None,
        f"CSV {path}",
        Path(path).name,
    )


# --- the analysis ------------------------------------------------------------------------


@dataclass
class PrepaidReport:
    intervals: Intervals
    on_demand_price: float
    prepaid_price: float  # per core-hour of commitment
    upfront: float | None
    term: str
    period_start: float
    period_end: float
    results: dict[str, PrepaidOptimum]

    @property
    def period_h(self) -> float:
        return (self.period_end - self.period_start) / 3600.0

    @property
    def break_even(self) -> float:
        return break_even_utilisation(self.on_demand_price, self.prepaid_price)


def analyse(
    intervals: Intervals,
    on_demand_price: float,
    *,
    prepaid_price: float | None = None,
    upfront: float | None = None,
    term: str = "1y",
) -> PrepaidReport:
    """The optimum per core type over the span of `intervals` (one of prepaid_price,
    per core-hour, or upfront, per core for the whole term)."""
    if (prepaid_price is None) == (upfront is None):
        raise ValueError("give exactly one of a prepaid price per core-hour or an upfront amount")
    if prepaid_price is not None:
        hourly = prepaid_price
    else:
        assert upfront is not None  # exactly one of the two, checked above
        hourly = prepaid_hourly_price(upfront, TERMS_Y[term])
    starts, ends = intervals.starts, intervals.ends
    lo = float(starts.min()) if starts.size else 0.0
    hi = float(ends.max()) if ends.size else lo
    results = optimal_by_core_type(
        starts,
        ends,
        intervals.cores,
        intervals.core_types,
        on_demand_price,
        hourly,
        lo,
        hi,
        hours_per_unit=1 / 3600,
    )
    return PrepaidReport(intervals, on_demand_price, hourly, upfront, term, lo, hi, results)


def sample_indices(result: PrepaidOptimum, points: int = DEFAULT_CURVE_POINTS) -> np.ndarray:
    """About `points` evenly spread indices into the curve, always with 0, the peak
    and the optimum."""
    size = result.curve_cores.size
    spread = np.round(np.linspace(0, size - 1, max(2, points - 1))).astype(int)
    optimum = int(np.searchsorted(result.curve_cores, result.optimal_cores))
    return np.unique(np.append(spread, optimum))


def explanation(report: PrepaidReport, result: PrepaidOptimum) -> str | None:
    """Why the optimum is 0, when it is."""
    if result.optimal_cores:
        return None
    if result.prepaid_never_pays:
        return (
            f"prepaid {usd(report.prepaid_price)} >= on-demand {usd(report.on_demand_price)} "
            "per core-hour: a prepaid core costs at least as much as the same hours on demand "
            "even if busy all the time, so buy none"
        )
    if result.all_core_hours == 0:
        return "no core-hours in the period: nothing to prepay"
    return (
        f"no core is busy {percent(result.break_even_utilisation, 3)} of the period "
        "(the break-even utilisation): buy none"
    )


def when_text(report: PrepaidReport, seconds: float) -> str:
    """A moment of the history: a UTC date, or seconds into a trace without one."""
    if report.intervals.absolute:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"trace second {seconds:,.0f}"


def price_text(report: PrepaidReport) -> str:
    """The prepaid price as given (upfront or per core-hour) and its term."""
    term = f"{TERMS_Y[report.term]}-year term"
    if report.upfront is not None:
        return (
            f"prepaid {usd(report.upfront)} upfront per core for a {term} = "
            f"{usd(report.prepaid_price)} per core-hour"
        )
    return f"prepaid {usd(report.prepaid_price)} per core-hour ({term})"


def as_dict(report: PrepaidReport, points: int = DEFAULT_CURVE_POINTS) -> dict[str, Any]:
    intervals = report.intervals
    groups = []
    for name, r in report.results.items():
        shown = sample_indices(r, points)
        groups.append(
            {
                "core_type": name,
                "peak_cores": r.max_cores,
                "all_core_hours": r.all_core_hours,
                "all_on_demand_cost_usd": r.all_on_demand_cost,
                "optimal_prepaid_cores": r.optimal_cores,
                "last_prepaid_core_utilisation": r.optimal_utilisation,
                "prepaid_cost_usd": r.prepaid_cost,
                "residual_on_demand_core_hours": r.residual_core_hours,
                "residual_on_demand_cost_usd": r.on_demand_cost,
                "savings_usd": r.savings,
                "savings_fraction": r.savings_fraction,
                "note": explanation(report, r),
                "curve": [
                    {
                        "prepaid_cores": int(r.curve_cores[i]),
                        "savings_usd": float(r.curve_savings[i]),
                        "utilisation": float(r.curve_utilisation[i]),
                    }
                    for i in shown
                ],
            }
        )
    return {
        "source": {
            "input": intervals.source,
            "intervals": int(intervals.starts.size),
            "skipped": intervals.skipped,
            "skipped_by_reason": intervals.skipped_by_reason,
            "notes": intervals.notes,
        },
        "period": {
            "start": when_text(report, report.period_start),
            "end": when_text(report, report.period_end),
            "start_s": report.period_start,
            "end_s": report.period_end,
            "hours": report.period_h,
        },
        "prices": {
            "on_demand_per_core_hour": report.on_demand_price,
            "prepaid_per_core_hour": report.prepaid_price,
            "prepaid_upfront_per_core": report.upfront,
            "term": report.term,
        },
        "break_even_utilisation": report.break_even,
        "core_types": groups,
    }


def write_plot(report: PrepaidReport, out: str | Path, groups: int = 6) -> None:
    from controller.tools.plots import plot_prepaid_savings

    shown = list(report.results.items())[:groups]
    plot_prepaid_savings(
        [
            (name, r.curve_cores, r.curve_savings, r.curve_utilisation, r.optimal_cores)
            for name, r in shown
        ],
        report.break_even,
        f"{report.intervals.label}: {price_text(report)}, on-demand "
        f"${report.on_demand_price:.4f}/core-hour",
        out,
    )


def read_store(state_dir: str | None, core_type: str | None) -> Intervals:
    """Intervals from the VMs of a state directory's store (core type: the VM type)."""
    from controller.config import load_config
    from controller.store import Store

    root = Path(state_dir) if state_dir else load_config(None).resolved_state_dir()
    path = root / "spotbag.db"
    if not path.exists():
        raise PrepaidError(
            "--from-store", f"no store at {path} (give --state-dir or SPOTBAG_STATE_DIR)"
        )

    async def load() -> list[tuple[float, float, int, str]]:
        store = Store(path, threaded=False)
        await store.open()
        try:
            return await store.vm_core_intervals()
        finally:
            await store.close()

    rows = asyncio.run(load())
    if not rows:
        raise PrepaidError("--from-store", f"{path}: no VM has run and ended yet; nothing to size")
    starts, ends, cores, types = zip(*rows, strict=True)
    if core_type not in (None, "vm_type"):
        raise PrepaidError(
            "--core-type",
            f"--from-store groups by VM type: --core-type vm_type (or leave it out), not "
            f"{core_type!r}",
        )
    return Intervals(
        np.array(starts, dtype=float),
        np.array(ends, dtype=float),
        np.array(cores, dtype=float),
        np.array(types, dtype=str) if core_type == "vm_type" else None,
        f"store {path}",
        f"VMs of {root}",
    )


def read_source(swf: str | None, csv_path: str | None, core_type: str | None) -> Intervals:
    """The intervals of the one source given; a PrepaidError names the option at fault."""
    option, path, reader = ("--swf", swf, read_swf) if swf else ("--csv", csv_path, read_csv)
    if path is None:
        raise PrepaidError("--csv", "give a usage history: --swf FILE or --csv FILE")
    try:
        return reader(path, core_type)
    except CoreTypeError as exc:
        raise PrepaidError("--core-type", str(exc)) from None
    except TraceError as exc:  # names the file and the line
        raise PrepaidError(option, str(exc)) from None
