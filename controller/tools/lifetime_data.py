"""Reading VM lifetime records (the CSV format of the shipped
controller/data/reference/goog-preemption/lifetimes.csv).

Columns: name, machine_type, zone, insert_time, end_time, lifetime_s, event, idle;
`event` is "preempted" or "stop" (stopped by its user: right-censored). Extra
columns are ignored; a bad row is an error naming its line; the file may be gzipped;
insert_time is ISO 8601 (no zone: UTC) or epoch seconds.
"""

from __future__ import annotations

import math
from pathlib import Path

from controller.traces.trace_io import Skipped, TraceError, csv_records, parse_datetime
from policies.registry import Observation, day_kind, region_of, time_of_day

REQUIRED = ("machine_type", "zone", "insert_time", "lifetime_s", "event")
GROUP_COLUMNS = ("machine_type", "zone", "region", "time_of_day", "day")


class LifetimeDataError(TraceError):
    """A lifetime file that cannot be used; the message names the file and line."""


def read_lifetimes(path: str | Path, provider: str = "gce") -> list[Observation]:
    """Every row of a lifetime CSV (gzip or not, read by controller.traces.trace_io) as an
    Observation; a bad row is an error naming its line, and so is a file without rows."""
    path = Path(path)
    observations = []
    try:
        with csv_records(path, REQUIRED) as table:
            for line, row in table:
                try:
                    launched = parse_datetime(row["insert_time"])
                    lifetime_h = float(row["lifetime_s"]) / 3600.0
                    event = row["event"]
                    if event not in ("preempted", "stop"):
                        raise ValueError(f"event must be 'preempted' or 'stop', not {event!r}")
                    if not 0 <= lifetime_h < math.inf:
                        raise ValueError(f"lifetime_s must be >= 0, not {row['lifetime_s']!r}")
                except (ValueError, TypeError) as exc:
                    raise LifetimeDataError(f"{path}:{line}: {exc}") from None
                observations.append(
                    Observation(
                        provider,
                        row["machine_type"],
                        row["zone"],
                        launched,
                        lifetime_h,
                        event == "preempted",
                    )
                )
        Skipped("lifetime").require_kept(len(observations), path)
    except LifetimeDataError:
        raise
    except TraceError as exc:
        raise LifetimeDataError(str(exc)) from None
    return observations


def group_value(observation: Observation, column: str) -> str:
    """The value of a --by column for one observation."""
    if column == "machine_type":
        return observation.vm_type
    if column == "zone":
        return observation.zone
    if column == "region":
        return region_of(observation.zone)
    if column == "time_of_day":
        return time_of_day(observation.launched)
    if column == "day":
        return day_kind(observation.launched)
    raise ValueError(f"cannot group by {column!r}; choose from {', '.join(GROUP_COLUMNS)}")
