#!/usr/bin/env python3
"""Benchmark: how long a daemon with a long history takes to serve again after kill -9.

Builds the state issue 14 names: a 100,000-job bag in flight (VMs take an hour to
boot here, so every job is still queued and holds a reservation) and a ledger of
1,000,000 rows (the reserve / charge / release entries of 333,334 settled attempts,
written through the store as the daemon writes them). Then kills the daemon with
SIGKILL and starts it again on the same state directory.

Prints the seconds from starting the process until `/healthz` answers 200, and until
the bag's status answers with all its jobs. Target (issue 14): /healthz within 10 s.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from targets import against

from controller.store import Store
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


async def add_history(db: Path, account: str, settled: int) -> int:
    """Append `settled` settled reservations (3 ledger rows each), in chunks."""
    store = Store(db)
    await store.open()
    try:
        chunk = 30_000
        for start in range(0, settled, chunk):
            rows = []
            for n in range(start, min(settled, start + chunk)):
                key = f"old-bag:{n}:1"
                at = 1.6e9 + n
                rows += [
                    (at, account, "reserve", 1.0, key, ""),
                    (at + 60, account, "charge", 0.25, key, ""),
                    (at + 60, account, "release", 0.75, key, ""),
                ]
            await store.append_ledger(rows)
    finally:
        await store.close()
    return 3 * settled


def healthz_after_restart(daemon: Daemon, bag_id: str, jobs: int) -> tuple[float, float]:
    started = time.monotonic()
    client = daemon.start()
    while not client.request("GET", "/healthz").get("ok"):
        time.sleep(0.05)
    healthy_s = time.monotonic() - started
    view = client.bag(bag_id)
    assert view["job_count"] == jobs, view
    return healthy_s, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--ledger-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-restart-") as tmp:
        state = Path(tmp)
        (state / "spotbag.toml").write_text(CONFIG)
        daemon = Daemon(state, state / "spotbag.toml", "bench")
        client = daemon.start()
        bag = client.submit(
            {
                "account": "bench",
                "command": "true {i}",
                "max_runtime_s": 60,
                "parameters": {"i": {"range": [0, args.jobs]}},
            }
        )
        daemon.stop(signal.SIGKILL)
        rows = asyncio.run(add_history(state / "spotbag.db", "bench", args.ledger_rows // 3))
        try:
            first_s, first_bag_s = healthz_after_restart(daemon, bag["id"], args.jobs)
            daemon.stop(signal.SIGKILL)
            again_s, again_bag_s = healthz_after_restart(daemon, bag["id"], args.jobs)
        finally:
            daemon.stop(signal.SIGKILL)
    print(f"state: a {args.jobs:,}-job bag in flight, {rows:,} history ledger rows")
    print(
        f"restart after kill -9: /healthz 200 in {first_s:.2f} s "
        f"(bag status in {first_bag_s:.2f} s); again: {again_s:.2f} s "
        f"({again_bag_s:.2f} s) {against(max(first_s, again_s), 10, 's until /healthz')}"
    )


if __name__ == "__main__":
    main()
