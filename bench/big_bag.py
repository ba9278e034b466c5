#!/usr/bin/env python3
"""Benchmark: a 1,000,000-job bag against the event loop and the daemon's memory.

Starts a real daemon (local driver; VMs take an hour to boot, so no job runs and the
figures are the daemon's own). While a probe thread asks `/healthz` every 20 ms, it
submits a bag of 1,000,000 jobs (a parameter range), waits until the daemon holds it,
then cancels it and waits until every job is cancelled.

Prints the worst `/healthz` latency during the submission and during the cancel
(what a client sees: the loop's stalls plus waiting for a CPU, on this 2-vCPU host shared
with the daemon's writer and expansion threads), the daemon's own record of its event
loop's longest stall (issue 14's target: never blocked more than 100 ms at a time), the
seconds each took, and the daemon's resident memory: holding the bag, its peak (VmHWM),
and after the cancel (target: <= 500 MB holding the bag).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
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


class Probe(threading.Thread):
    """GET /healthz every 20 ms; keeps the latencies of the current phase."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url + "/healthz"
        self.latencies_s: list[float] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.perf_counter()
            with urllib.request.urlopen(self.url, timeout=60) as response:
                response.read()
            self.latencies_s.append(time.perf_counter() - started)
            time.sleep(0.02)

    def phase(self) -> list[float]:
        latencies, self.latencies_s = self.latencies_s, []
        return latencies


def loop_lag(client) -> tuple[float, dict[float, float]]:
    """The daemon's own record of its event loop (controller/plumbing/loop_lag.py): the longest
    stall since start, and the histogram's cumulative counts by upper bound (s)."""
    text, _ = client.request("GET", "/metrics", raw=True)
    longest, buckets = 0.0, {}
    for line in text.decode().splitlines():
        if line.startswith("spotbag_event_loop_lag_max_seconds "):
            longest = float(line.split()[1])
        elif line.startswith("spotbag_event_loop_lag_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float(bound)] = float(line.split()[1])
    return longest, buckets


def stalls_over(before: dict[float, float], after: dict[float, float], bound_s: float) -> int:
    """Late wake-ups above `bound_s` between two readings of the histogram."""
    total = after[float("inf")] - before[float("inf")]
    return int(total - (after[bound_s] - before[bound_s]))


def memory_mb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) of a process, MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument(
        "--hold",
        action="store_true",
        help="the account has credit for 10 jobs: the rest wait, held (on_insufficient_balance)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotbag-bench-bigbag-") as tmp:
        state = Path(tmp)
        config = CONFIG
        if args.hold:  # 10 jobs of 1 CPU × 60 s fit: 10/60 CPU-h
            config += '[ledger]\nnew_accounts = "credit"\nnew_account_cpu_h = 0.1667\n'
        (state / "spotbag.toml").write_text(config)
        daemon = Daemon(state, state / "spotbag.toml", "bench")
        client = daemon.start()
        client.timeout_s = 600
        pid = daemon.process.pid
        idle_mb, _ = memory_mb(pid)
        probe = Probe(client.url)
        probe.start()
        try:
            time.sleep(0.5)
            probe.phase()
            _, lag_at_start = loop_lag(client)
            started = time.perf_counter()
            bag = client.submit(
                {
                    "account": "bench",
                    "command": "true {i}",
                    "max_runtime_s": 60,
                    "parameters": {"i": {"range": [0, args.jobs]}},
                    **({"on_insufficient_balance": "hold"} if args.hold else {}),
                }
            )

            def waiting() -> int:
                counts = client.bag(bag["id"])["counts"]
                return counts.get("queued", 0) + counts.get("held", 0)

            while waiting() < args.jobs:
                time.sleep(0.1)
            submit_s = time.perf_counter() - started
            time.sleep(2.0)  # the scheduler's passes over the held bag
            submit_latencies = probe.phase()
            submit_lag_max_s, lag_after_submit = loop_lag(client)
            holding_mb, _ = memory_mb(pid)

            started = time.perf_counter()
            client.cancel(bag["id"])
            while client.bag(bag["id"])["counts"].get("cancelled", 0) < args.jobs:
                time.sleep(0.1)
            cancel_s = time.perf_counter() - started
            cancel_latencies = probe.phase()
            overall_lag_max_s, lag_after_cancel = loop_lag(client)
            after_mb, peak_mb = memory_mb(pid)
        finally:
            probe.stopped.set()
            daemon.stop()
    held = " (credit for 10 jobs: the rest held)" if args.hold else ""
    print(f"a {args.jobs:,}-job bag{held} (daemon idle: {idle_mb:.0f} MB resident)")
    print(
        f"submit: held in {submit_s:.1f} s; /healthz worst {1000 * max(submit_latencies):.0f} ms "
        f"over {len(submit_latencies)} probes (a client's view; the 100 ms bound is on the loop, below)"
    )
    print(
        f"cancel: all cancelled in {cancel_s:.1f} s; /healthz worst "
        f"{1000 * max(cancel_latencies):.0f} ms over {len(cancel_latencies)} probes"
    )
    print(
        f"event loop (the daemon's own timer, due every 20 ms): longest stall while submitting "
        f"{1000 * submit_lag_max_s:.0f} ms {against(1000 * submit_lag_max_s, 100, 'ms')}, "
        f"{stalls_over(lag_at_start, lag_after_submit, 0.1)} stalls over 100 ms; "
        f"while cancelling {stalls_over(lag_after_submit, lag_after_cancel, 0.1)} over 100 ms "
        f"(longest of the whole run {1000 * overall_lag_max_s:.0f} ms)"
    )
    print(
        f"memory: {holding_mb:.0f} MB holding the bag, peak {peak_mb:.0f} MB, "
        f"{after_mb:.0f} MB after the cancel {against(holding_mb, 500, 'MB holding the bag')}"
    )


if __name__ == "__main__":
    main()
