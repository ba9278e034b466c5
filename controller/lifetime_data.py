"""Reading VM lifetime records (the CSV format of ../shared/data/goog-preemption/).

Columns: name, machine_type, zone, insert_time, end_time, lifetime_s, event, idle;
`event` is "preempted" or "stop" (stopped by its user: right-censored). Extra
columns are ignored; a bad row is an error naming its line.
"""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

from policies.registry import Observation, day_kind, region_of, time_of_day

REQUIRED = ("machine_type", "zone", "insert_time", "lifetime_s", "event")
GROUP_COLUMNS = ("machine_type", "zone", "region", "time_of_day", "day")


class LifetimeDataError(ValueError):
    pass


def read_lifetimes(path: str | Path, provider: str = "gce") -> list[Observation]:
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise LifetimeDataError(f"cannot read {path}: {exc.strerror}") from None
    observations = []
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise LifetimeDataError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                launched = dt.datetime.fromisoformat(row["insert_time"])
                if launched.tzinfo is None:
                    launched = launched.replace(tzinfo=dt.UTC)
                lifetime_h = float(row["lifetime_s"]) / 3600.0
                event = row["event"].strip()
                if event not in ("preempted", "stop"):
                    raise ValueError(f"event must be 'preempted' or 'stop', not {event!r}")
                if not lifetime_h >= 0:
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
    if not observations:
        raise LifetimeDataError(f"{path}: no lifetimes")
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
