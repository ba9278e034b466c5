"""The daemon as systemd runs it (Type=notify): READY=1 once serving, STOPPING=1 on
SIGTERM, and exit status 78 for a configuration it cannot use."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_ready_and_stopping_are_notified(make_daemon, tmp_path):
    address = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(address)
        listener.settimeout(20)
        daemon = make_daemon()
        client = daemon.start(extra_env={"NOTIFY_SOCKET": address})
        # While it recovers, it asks for more time (a long recovery is not killed by
        # TimeoutStartSec); then it is ready.
        starting = listener.recv(4096).decode().splitlines()
        assert starting[0].startswith("STATUS=starting")
        assert starting[1] == "EXTEND_TIMEOUT_USEC=30000000"
        ready = listener.recv(4096).decode().splitlines()
        while ready[0] != "READY=1":
            assert ready[1].startswith("EXTEND_TIMEOUT_USEC="), ready
            ready = listener.recv(4096).decode().splitlines()
        assert ready[1] == f"STATUS=serving {client.url} (driver local)"
        assert client.health()["ok"]
        # Jobs do not get the socket: they are not the service.
        bag = client.submit(
            {"account": "a", "command": "echo ${{NOTIFY_SOCKET:-unset}}", "max_runtime_s": 10}
        )
        from tests.conftest import wait_for_bag

        wait_for_bag(client, bag["id"])
        assert client.log(f"{bag['id']}-0")[0] == b"unset\n"
        assert daemon.stop() == 0
        assert listener.recv(4096).decode().startswith("STOPPING=1")


def test_a_bad_configuration_exits_78(tmp_path):
    (tmp_path / "bad.toml").write_text("[scheduler]\nmax_vms = 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "controller.cli",
            "--state-dir",
            str(tmp_path / "state"),
            "serve",
            "--config",
            str(tmp_path / "bad.toml"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert result.returncode == 78
    assert "scheduler.max_vms" in result.stderr
