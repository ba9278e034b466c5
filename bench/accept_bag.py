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
- GET /v1/bags/{id} latency over many requests (median and p95).
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

N = 100_000


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

            latencies_ms = []
            for _ in range(300):
                started = time.perf_counter()
                view = client.bag(product_bag["id"])
                latencies_ms.append(1000 * (time.perf_counter() - started))
            assert view["job_count"] == N
            latencies_ms.sort()
        finally:
            daemon.stop()

    print(
        f"accept a {N:,}-job bag (parameter product) over HTTP: {product_s:.2f} s until every row is persisted"
    )
    print(f"accept a {N:,}-job bag ({body_mb:.1f} MB of explicit points):  {points_s:.2f} s")
    print(
        f"GET /v1/bags/{{id}} of that bag, 300 requests: median {statistics.median(latencies_ms):.1f} ms, "
        f"p95 {latencies_ms[int(0.95 * len(latencies_ms))]:.1f} ms, max {latencies_ms[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
