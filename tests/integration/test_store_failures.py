"""The daemon on a full filesystem: its state directory on a small tmpfs that fills up.

A write that fails is no 500 and no dead scheduler: `POST /v1/bags` answers 503 (the
bag is not taken, nothing is reserved), `/healthz` answers 503 with the reason, the
scheduler retries with back-off, and once space is freed everything carries on: the
health is ok again and every bag taken runs to the end.

Needs root (to mount a tmpfs). Skipped otherwise, with the reason; under CI=true
(.ci/run runs as root) a missing capability is a failure.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import subprocess
import urllib.error
import urllib.request

import pytest

from controller.cli.client import ClientError
from tests.conftest import FAST_CONFIG, Daemon, wait_for_bag, wait_until

pytestmark = pytest.mark.integration


def require_root_mounts() -> None:
    reason = None
    if os.geteuid() != 0:
        reason = "mounting a tmpfs needs root"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: .ci/run runs the suite as root)")
        pytest.skip(reason)


@pytest.fixture
def small_disk(tmp_path):
    require_root_mounts()
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk) -> None:
    """Fill the filesystem to the last byte."""
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        size = 1 << 20
        while size:
            try:
                os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                size //= 2
    finally:
        os.close(fd)


def health(client) -> dict:
    """/healthz's answer, 200 or 503."""
    try:
        with urllib.request.urlopen(client.url + "/healthz", timeout=10) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        assert exc.code == 503, exc.code
        return json.loads(exc.read())


def bag_spec(n: int, command: str = "true") -> dict:
    return {
        "account": "a",
        "command": command,
        "parameters": {"i": {"range": [0, n]}},
        "max_runtime_s": 60,
    }


def test_a_full_disk_is_a_503_and_a_retry_not_a_dead_scheduler(small_disk):
    state = small_disk / "state"
    state.mkdir()
    config = state / "spotbag.toml"
    config.write_text(
        FAST_CONFIG.format(token="t", model="none", mttf_h=24.0, time_scale=1.0, max_vms=2)
    )
    daemon = Daemon(state, config, "t")
    client = daemon.start()
    try:
        running = client.submit(bag_spec(40, "sleep 0.2"))
        fill(small_disk)
        # Bags are taken while the database still has room in its files; then refused.
        taken = [running["id"]]

        def refused() -> ClientError | None:
            try:
                taken.append(client.submit(bag_spec(50))["id"])
            except ClientError as exc:
                return exc
            return None

        error = wait_until(refused, 60, 0.05, "a bag refused for want of space")
        assert error.status == 503, error
        assert error.code == "store_unavailable"
        assert "full" in error.message
        # The scheduler's writes fail too: the daemon says it is not healthy, and why.
        unhealthy = wait_until(
            lambda: (lambda h: h if not h.get("ok") else None)(health(client)),
            60,
            0.2,
            "/healthz to report the failure",
        )
        assert "full" in " ".join(unhealthy["problems"]), unhealthy
        metrics = client.request("GET", "/metrics", raw=True)[0].decode()
        assert "spotbag_store_errors_total" in metrics

        # Space again: healthy, and every bag taken runs to the end.
        (small_disk / "filler").unlink()
        wait_until(lambda: health(client).get("ok"), 60, 0.2, "health to come back")
        for bag_id in taken:
            assert wait_for_bag(client, bag_id, 120)["state"] == "succeeded"
        assert wait_for_bag(client, client.submit(bag_spec(3))["id"])["state"] == "succeeded"
        assert daemon.stop() == 0
    finally:
        if daemon.process is not None and daemon.process.poll() is None:
            daemon.process.kill()


def test_a_scheduler_that_keeps_failing_takes_the_daemon_down_non_zero(make_daemon):
    """Not half alive: when the scheduler fails for a reason that is not passing (here
    a table dropped under it), the daemon exits non-zero, so systemd restarts it."""
    daemon = make_daemon()
    client = daemon.start()
    bag = client.submit(bag_spec(40, "sleep 0.3"))
    wait_until(lambda: client.bag(bag["id"])["counts"].get("running"), 30, 0.1)
    with sqlite3.connect(daemon.state_dir / "spotbag.db") as conn:
        conn.execute("DROP TABLE transitions")  # every pass that ends a job writes there
    assert daemon.process.wait(60) == 1
    log = daemon.log()
    assert "task scheduler failed" in log, log[-3000:]
    assert "stopped" in log.splitlines()[-1] or "stopped" in log  # every stop step ran
