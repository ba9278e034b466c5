"""Prometheus metrics (text format at /metrics) through prometheus_client.

Counters and the scheduler-pass histogram are updated as things happen; the
gauges (open jobs by state, live VMs by state) are read from the scheduler's
memory when scraped. Each daemon has its own registry, so several can share a
process (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# The *_created series double the output and tell nothing a process start time does not.
disable_created_metrics()


class _GaugeCollector(Collector):
    def __init__(self, read: Callable[[], dict[str, dict[str, int]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        values = self._read()
        jobs = GaugeMetricFamily("spotbag_jobs", "Open jobs by state.", labels=["state"])
        for state, n in values.get("jobs", {}).items():
            jobs.add_metric([state], n)
        yield jobs
        vms = GaugeMetricFamily(
            "spotbag_vms", "Live VMs by state (idle VMs are also running).", labels=["state"]
        )
        for state, n in values.get("vms", {}).items():
            vms.add_metric([state], n)
        yield vms


class _HealthCollector(Collector):
    def __init__(self, read: Callable[[], tuple[int, list[str]]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        write_errors, problems = self._read()
        yield CounterMetricFamily(
            "spotbag_store_errors",
            "Database writes that failed for want of disk, an I/O error or a locked file.",
            value=write_errors,
        )
        yield GaugeMetricFamily(
            "spotbag_healthy", "1 when /healthz answers 200, else 0.", value=int(not problems)
        )


class _LoopLagCollector(Collector):
    def __init__(self, read: Callable[[], float]) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "spotbag_event_loop_lag_max_seconds",
            "The event loop's longest stall since the daemon started.",
            value=self._read(),
        )


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.preemptions = Counter(
            "spotbag_preemptions",
            "VMs preempted (or lost) under the controller.",
            registry=self.registry,
        )
        self.attempts = Counter(
            "spotbag_attempts", "Attempts ended, by final state.", ["state"], registry=self.registry
        )
        self.jobs_finished = Counter(
            "spotbag_jobs_finished",
            "Jobs finished, by final state.",
            ["state"],
            registry=self.registry,
        )
        self.vm_launches = Counter(
            "spotbag_vm_launches",
            "VM launch calls, by type and result.",
            ["vm_type", "result"],
            registry=self.registry,
        )
        self.tick_seconds = Histogram(
            "spotbag_scheduler_loop_seconds",
            "Duration of one scheduler pass.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.loop_lag_seconds = Histogram(
            "spotbag_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 20 ms: how long it was held.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5),
            registry=self.registry,
        )
        self.http_requests = Counter(
            "spotbag_http_requests",
            "HTTP requests, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.http_connections_refused = Counter(
            "spotbag_http_connections_refused",
            "HTTP connections closed by the caps ([api] max_connections*): refused over the "
            "per-client cap (per_client_cap) or the total one (total_cap), or an older one "
            "not in a request closed to make room for a new one (made_room).",
            ["reason"],
            registry=self.registry,
        )
        self.http_connections_open = Gauge(
            "spotbag_http_connections_open",
            "HTTP connections open now.",
            registry=self.registry,
        )

    def watch_loop_lag(self, max_lag_s: Callable[[], float]) -> None:
        """Report the event loop's longest stall since start (controller/plumbing/loop_lag.py)."""
        self.registry.register(_LoopLagCollector(max_lag_s))

    def watch_health(self, read: Callable[[], tuple[int, list[str]]]) -> None:
        """Report the store's failed writes and whether the daemon is healthy, as
        `read()` returns them (failed writes so far, current problems), on every scrape."""
        self.registry.register(_HealthCollector(read))

    def watch(self, read: Callable[[], dict[str, dict[str, int]]]) -> None:
        """Report the gauges returned by `read()` on every scrape."""
        self.registry.register(_GaugeCollector(read))

    def render(self) -> bytes:
        return generate_latest(self.registry)
