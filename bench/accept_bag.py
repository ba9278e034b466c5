#!/usr/bin/env python3
"""Benchmark: accepting a 100,000-job bag over HTTP, and the latency of its status.

Starts a real daemon (local driver) on a temporary state directory. VMs take an
hour to boot here, so no job runs while we measure: the figures are the API's
and the store's, not the host's CPU being shared with jobs.

Prints:
- seconds from sending POST /v1/bags until the 201 answer, which the daemon
  sends only after the bag and all its job rows are committed (checked by
  counting the rows in the database afterwards) — for a parameter product and
  for the same bag as 100,000 explicit points;
- GET /v1/bags/{id} latency over many requests (median and p95), first with the
  daemon quiet, then on a second daemon that is busy running the bag's jobs (32
  job processes at a time, VMs booting and jobs ending every second).
Targets (issue 2): accept <= 3 s, status <= 50 ms.
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against

from tests.conftest import Daemon

CONFIG = """
[api]
port = 0
token = "bench"
[scheduler]
max_vms = 8
[driver]
name = "local"
boot_delay_s = 3600.0
"""

BUSY_CONFIG = """
[api]
port = 0
token = "bench"
[scheduler]
max_vms = 4
poll_interval_s = 0.2
[driver]
name = "local"
boot_delay_s = 0.2
[[vm_types]]
name = "local-8"
cpus = 8
memory_gb = 32.0
spot_price_per_hour = 0.11
on_demand_price_per_hour = 0.384
"""

N = 100_000


def status_latency_ms(client, bag_id: str, requests: int = 300) -> list[float]:
    latencies = []
    for _ in range(requests):
        started = time.perf_counter()
        view = client.bag(bag_id)
        latencies.append(1000 * (time.perf_counter() - started))
    assert view["job_count"] == N
    return sorted(latencies)


def busy_status_latency_ms() -> tuple[list[float], int]:
    """Status latency of a 100,000-job bag while 32 of its jobs run at a time."""
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-busy-") as tmp:
        state = Path(tmp)
        (state / "spotbag.toml").write_text(BUSY_CONFIG)
        daemon = Daemon(state, state / "spotbag.toml", "bench")
        client = daemon.start()
        try:
            bag = client.submit(
                {
                    "account": "bench",
                    "command": "sleep 0.5",
                    "max_runtime_s": 60,
                    "resources": {"cpus": 1, "memory_gb": 0.5},
                    "parameters": {"i": {"range": [0, N]}},
                }
            )
            time.sleep(5.0)  # VMs up, jobs cycling
            latencies = status_latency_ms(client, bag["id"])
            done = client.bag(bag["id"])["counts"]["succeeded"]
            client.cancel(bag["id"])
        finally:
            daemon.stop()
    return latencies, done


def report(label: str, latencies_ms: list[float]) -> str:
    return (
        f"{label}: median {statistics.median(latencies_ms):.1f} ms, "
        f"p95 {latencies_ms[int(0.95 * len(latencies_ms))]:.1f} ms, max {latencies_ms[-1]:.1f} ms"
    )


def timed_submit(client, spec) -> tuple[float, dict]:
    started = time.perf_counter()
    bag = client.submit(spec)
    return time.perf_counter() - started, bag


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-") as tmp:
        state = Path(tmp)
        (state / "spotbag.toml").write_text(CONFIG)
        daemon = Daemon(state, state / "spotbag.toml", "bench")
        client = daemon.start()
        try:
            product = {
                "account": "bench",
                "command": "true {a} {b}",
                "max_runtime_s": 60,
                "parameters": {"a": {"range": [0, 100]}, "b": {"range": [0, 1000]}},
            }
            points = {
                "account": "bench",
                "command": "true {a} {b}",
                "max_runtime_s": 60,
                "points": [{"a": i // 1000, "b": i % 1000} for i in range(N)],
            }
            body_mb = len(json.dumps(points)) / 1e6
            client.submit({"account": "bench", "command": "true", "max_runtime_s": 1})  # warm up

            product_s, product_bag = timed_submit(client, product)
            points_s, points_bag = timed_submit(client, points)
            with sqlite3.connect(state / "spotbag.db") as conn:
                for bag in (product_bag, points_bag):
                    rows = conn.execute(
                        "SELECT count(*) FROM jobs WHERE bag_id = ?", (bag["id"],)
                    ).fetchone()[0]
                    assert rows == N, f"{bag['id']}: {rows} rows persisted"

            latencies_ms = status_latency_ms(client, product_bag["id"])
        finally:
            daemon.stop()
    busy_ms, jobs_done = busy_status_latency_ms()

    print(
        f"accept a {N:,}-job bag (parameter product) over HTTP: {product_s:.2f} s until every row "
        f"is persisted {against(product_s, 3, 's')}"
    )
    print(
        f"accept a {N:,}-job bag ({body_mb:.1f} MB of explicit points):  {points_s:.2f} s "
        f"{against(points_s, 3, 's')}"
    )
    quiet = report("GET /v1/bags/{id} of that bag, 300 requests, daemon quiet", latencies_ms)
    p95_ms = latencies_ms[int(0.95 * len(latencies_ms))]
    print(f"{quiet} {against(p95_ms, 50, 'ms at p95')}")
    print(
        report(
            f"the same while its jobs run ({jobs_done:,} done by the end of the measurement)",
            busy_ms,
        )
    )


if __name__ == "__main__":
    main()
