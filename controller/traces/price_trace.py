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
from policies.spot_outage import expected_outage_left

REQUIRED_COLUMNS = ("az", "instance_type", "timestamp_utc", "spot_price_usd_hr")
__all__ = ["PriceTrace", "TraceError", "TraceMarket", "TraceReplay", "read_trace"]


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


def parse_series(text: str) -> tuple[str, str]:
    """A trace series named TYPE/ZONE ("c3.xlarge/us-east-1a")."""
    vm_type, sep, zone = text.partition("/")
    if not sep or not vm_type or not zone:
        raise TraceError(f"a trace series is TYPE/ZONE (c3.xlarge/us-east-1a), not {text!r}")
    return vm_type, zone


# The past over which outages are averaged (as policies/deadline_sim.py).
OUTAGE_WINDOW_S = 24 * 3600.0


class TraceMarket:
    """A spot market that follows one series of a trace, for `spotbag simulate`
    (controller/simulation.py): every VM type's spot price at clock time t is the
    series' price at trace time `trace_start_s` + (t − `started_at_s`); before the
    series' first change its first price, after its last change its last price (no
    wrapping: a run sees one stretch of the market).

    The sim driver (drivers/local.py, its `spot_market`) launches a spot VM only while
    the price is at or below the bid (the type's on-demand price, as
    policies/deadline_sim.py's Market) and preempts it when the price first rises
    above it; the scheduler's deadline policies read the price now and how long an
    outage is expected to last (`outage_left_s`); the store gets the price changes as
    price samples (`samples`), by which the cost reports bill each spot VM ∫ price dt.
    """

    def __init__(
        self, trace: PriceTrace, series: tuple[str, str], started_at_s: float, trace_start_s: float
    ) -> None:
        if series not in trace.vms:
            known = ", ".join(f"{t}/{z}" for t, z in trace.vms)
            raise TraceError(f"the trace has no series {series[0]}/{series[1]} (it has {known})")
        i = trace.vms.index(series)
        self.series = series
        self.on_demand_price_per_hour = float(trace.on_demand[i])
        self._offset_s = started_at_s - trace_start_s  # clock time = trace time + offset
        self._times = (trace.times_s[i] + self._offset_s).tolist()  # clock seconds
        self._prices = trace.prices[i].tolist()
        self._by_bid: dict[float, tuple[list[float], list[float]]] = {}

    def price_at(self, vm_type: str, zone: str, at: float) -> float:
        """The spot price (USD/h) in effect at clock time `at` (any type and zone)."""
        return self._prices[max(bisect.bisect_right(self._times, at) - 1, 0)]

    def first_above(self, vm_type: str, zone: str, bid: float, after: float) -> float:
        """The first moment after `after` at which the price is above `bid` (inf: never;
        `after` itself is not looked at: a VM launched then was launched at or below it)."""
        starts, _ = self._outages(bid)
        k = bisect.bisect_right(starts, after)
        # An outage already under way at `after` counts from its next rise, which is
        # the next outage's start (prices at or below the bid separate outages).
        return starts[k] if k < len(starts) else math.inf

    def outage_left_s(
        self, vm_type: str, zone: str, bid: float, at: float, window_s: float = OUTAGE_WINDOW_S
    ) -> float:
        """0 while the price is at or below `bid`; else how much longer it is expected to
        stay above: the mean length of the outages that ended in the past `window_s`, at
        least as long again as this one has lasted so far (policies/deadline_sim.py's
        `outage_left_h`; from the past only, as a scheduler knows it)."""
        starts, ends = self._outages(bid)
        k = bisect.bisect_right(starts, at) - 1
        if k < 0 or ends[k] <= at:
            return 0.0
        so_far = at - starts[k]
        first = bisect.bisect_left(ends, at - window_s, 0, k)
        lengths = [ends[j] - starts[j] for j in range(first, k)]
        mean = sum(lengths) / len(lengths) if lengths else so_far
        return expected_outage_left(mean, so_far)

    def _outages(self, bid: float) -> tuple[list[float], list[float]]:
        """The stretches of clock time [start, end) the price is above `bid` (the last
        one's end inf if the series ends above it), computed once per bid."""
        known = self._by_bid.get(bid)
        if known is not None:
            return known
        starts: list[float] = []
        ends: list[float] = []
        above = False
        for at, price in zip(self._times, self._prices, strict=True):
            if price > bid and not above:
                starts.append(at)
            elif price <= bid and above:
                ends.append(at)
            above = price > bid
        if above:
            ends.append(math.inf)
        self._by_bid[bid] = (starts, ends)
        return starts, ends

    def samples(self, vm_types: Sequence[tuple[str, str]], since: float, until: float):
        """(vm_type, zone, at, price) rows for the store's price samples: the price in
        effect at `since` and every change after it up to `until`, for each (type,
        zone) of the catalog."""
        lo = max(bisect.bisect_right(self._times, since) - 1, 0)
        hi = bisect.bisect_right(self._times, until)
        points = [(since, self._prices[lo])] + [
            (self._times[k], self._prices[k]) for k in range(lo + 1, hi)
        ]
        return [(t, z, at, price) for t, z in vm_types for at, price in points]
