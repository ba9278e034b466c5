"""Spot price traces: reading them, putting them on a regular grid, and replaying them as
a price source for the local and sim drivers.

The format is the one of the shipped 2015 trace (controller/data/reference/spot-prices/;
`spotbag data path spot-prices`), CSV, gzipped or not (read by
controller.traces.trace_io):

    region,az,instance_type,product,timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr

one row per price change. A VM of the trace is an (instance type, zone) pair. On a grid
of `step_s`, each VM's price at a step is the last change at or before it (NaN before
its first change); VM sizes come from controller.traces.vm_size (the bundled EC2 and GCE
table, a --types file, a config's catalog). Timestamps are ISO 8601 or epoch seconds;
no zone means UTC.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.traces import trace_io
from controller.traces.trace_io import TraceError, parse_time
from controller.traces.vm_size import VmSize, bundled_sizes, sizes_of
from drivers.base import PriceSample
from policies.hopping import Fleet

REQUIRED_COLUMNS = ("az", "instance_type", "timestamp_utc", "spot_price_usd_hr")
__all__ = ["PriceTrace", "TraceError", "TraceReplay", "read_trace"]


@dataclass(frozen=True)
class PriceTrace:
    """Every price change of a trace, per VM (type, zone), in time order."""

    vms: tuple[tuple[str, str], ...]  # (type, zone), sorted
    times_s: tuple[np.ndarray, ...]  # per VM: epoch seconds of its changes
    prices: tuple[np.ndarray, ...]  # per VM: USD/h from each change on
    on_demand: np.ndarray  # per VM: USD/h (NaN if the trace has none)

    @property
    def start_s(self) -> float:
        return min(float(t[0]) for t in self.times_s)

    @property
    def common_start_s(self) -> float:
        """The first moment every VM of the trace has a price."""
        return max(float(t[0]) for t in self.times_s)

    @property
    def end_s(self) -> float:
        return max(float(t[-1]) for t in self.times_s)

    def grid(self, step_s: float, start_s: float | None = None, end_s: float | None = None):
        """(times (T,), prices (T, N)): each VM's price in effect at each step."""
        start = self.start_s if start_s is None else start_s
        end = self.end_s if end_s is None else end_s
        times = np.arange(start, end + 1e-9, step_s)
        matrix = np.full((len(times), len(self.vms)), np.nan)
        for i, (changes, values) in enumerate(zip(self.times_s, self.prices, strict=True)):
            at = np.searchsorted(changes, times, side="right") - 1
            matrix[:, i] = np.where(at >= 0, values[np.maximum(at, 0)], np.nan)
        return times, matrix

    def fleet(
        self,
        sizes: Mapping[str, VmSize] | None = None,
        bid_factor: float = 1.0,
    ) -> Fleet:
        """The trace's VMs with their sizes and bids (bid_factor × on-demand); sizes
        by type name (default: the bundled EC2 and GCE table)."""
        known = bundled_sizes() if sizes is None else sizes
        size = sizes_of([t for t, _ in self.vms], known)
        return Fleet(
            names=tuple(f"{t}/{z}" for t, z in self.vms),
            cpus=np.array([size[t].vcpus for t, _ in self.vms]),
            memory_gb=np.array([size[t].memory_gb for t, _ in self.vms]),
            on_demand=self.on_demand.copy(),
            bid=self.on_demand * bid_factor,
        )

    def select(self, types: Sequence[str] | None = None, zones: Sequence[str] | None = None):
        """The trace restricted to some types and/or zones."""
        keep = [
            i
            for i, (t, z) in enumerate(self.vms)
            if (not types or t in types) and (not zones or z in zones)
        ]
        if not keep:
            raise TraceError(f"no VM of the trace matches types={types} zones={zones}")
        return PriceTrace(
            tuple(self.vms[i] for i in keep),
            tuple(self.times_s[i] for i in keep),
            tuple(self.prices[i] for i in keep),
            self.on_demand[keep],
        )


def read_trace(path: str | Path) -> PriceTrace:
    """Read a trace file (module docstring; gzip or not, by its first bytes); a bad
    row is a TraceError naming its line and field, and so is a file without rows."""
    path = Path(path)
    changes: dict[tuple[str, str], list[tuple[float, float]]] = {}
    on_demand: dict[tuple[str, str], float] = {}
    with trace_io.csv_records(path, REQUIRED_COLUMNS) as table:
        for line, row in table:
            key = (row["instance_type"], row["az"])
            try:
                at = parse_time(row["timestamp_utc"])
            except ValueError:
                raise TraceError(
                    f"{path}:{line}: timestamp_utc {row['timestamp_utc']!r} is not a timestamp"
                ) from None
            try:
                price = float(row["spot_price_usd_hr"])
            except ValueError:
                raise TraceError(
                    f"{path}:{line}: spot_price_usd_hr {row['spot_price_usd_hr']!r} is not a number"
                ) from None
            if not math.isfinite(price) or price < 0:
                raise TraceError(f"{path}:{line}: spot_price_usd_hr must be >= 0, not {price}")
            changes.setdefault(key, []).append((at, price))
            od = row.get("ondemand_price_usd_hr") or ""
            if od:
                try:
                    on_demand[key] = float(od)
                except ValueError:
                    raise TraceError(
                        f"{path}:{line}: ondemand_price_usd_hr {od!r} is not a number"
                    ) from None
    trace_io.Skipped("price row").require_kept(len(changes), path)
    vms = tuple(sorted(changes))
    times, prices = [], []
    for vm in vms:
        rows = sorted(changes[vm])
        times.append(np.array([r[0] for r in rows]))
        prices.append(np.array([r[1] for r in rows]))
    return PriceTrace(
        vms, tuple(times), tuple(prices), np.array([on_demand.get(vm, np.nan) for vm in vms])
    )


class TraceReplay:
    """A price source for the local and sim drivers: the trace's prices at the driver's
    time, mapped onto the catalog's type names. The trace is replayed from its start at
    `started_at_s` (epoch seconds of the driver's clock), `speed` trace seconds per
    clock second, wrapping around at its end."""

    def __init__(
        self,
        trace: PriceTrace,
        started_at_s: float,
        *,
        type_map: Mapping[str, str] | None = None,
        speed: float = 1.0,
    ) -> None:
        self._trace = trace
        self._started_at_s = started_at_s
        self._speed = speed
        self._type_map = dict(type_map or {})  # catalog type -> trace type

    def trace_time_s(self, now_s: float) -> float:
        span = self._trace.end_s - self._trace.start_s
        offset = (now_s - self._started_at_s) * self._speed
        return self._trace.start_s + (offset % span if span > 0 else 0.0)

    def prices_at(
        self, now_s: float, types: Sequence[str], zones: Sequence[str]
    ) -> list[PriceSample]:
        at = self.trace_time_s(now_s)
        samples = []
        for vm_type in types:
            trace_type = self._type_map.get(vm_type, vm_type)
            for (t, zone), changes, values in zip(
                self._trace.vms, self._trace.times_s, self._trace.prices, strict=True
            ):
                if t != trace_type or (zones and zone not in zones):
                    continue
                i = bisect.bisect_right(changes.tolist(), at) - 1
                if i >= 0:
                    samples.append(PriceSample(vm_type, zone, float(values[i]), now_s))
        return samples
