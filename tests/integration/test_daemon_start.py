"""The daemon listens first, then loads (issue 24; controller/service.py): while it
starts, /healthz says "starting" and every other route answers 503 with Retry-After,
having changed nothing; it is ready (200 "ok", READY=1 to systemd) once its scheduler
runs.

What holds a start here is the database: the test keeps a write lock on it, so the
daemon cannot migrate its schema (on the store's writer thread) until the test lets go.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, wait_until, wait_until_ready

pytestmark = pytest.mark.integration


@contextmanager
def database_locked(state_dir: Path) -> Iterator[None]:
    """The daemon's database, held by a write transaction of ours (WAL: it can read)."""
    db = sqlite3.connect(state_dir / "spotbag.db", isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        db.execute("COMMIT")
        db.close()


def answer(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: Any = None
) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def url_of(state_dir: Path) -> str:
    url_file = state_dir / "api.url"
    return str(wait_until(lambda: url_file.exists() and url_file.read_text().strip(), 60))


def test_it_answers_while_it_starts_and_is_ready_once_its_scheduler_runs(make_daemon, tmp_path):
    daemon = make_daemon()
    notify_path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as systemd:
        systemd.bind(notify_path)
        systemd.settimeout(0.5)
        with database_locked(daemon.state_dir):
            process = daemon.launch(extra_env={"NOTIFY_SOCKET": notify_path})
            url = url_of(daemon.state_dir)
            auth = {"Authorization": f"Bearer {daemon.token}"}

            status, headers, body = answer(url + "/healthz")
            assert status == 503
            assert json.loads(body) == {"ok": False, "status": "starting", "driver": "local"}
            assert headers["Retry-After"] == "1"
            # Closed after each answer: the next request may reach the full API.
            assert headers["Connection"] == "close"

            status, headers, body = answer(url + "/v1/bags", headers=auth)
            assert (status, headers["Retry-After"]) == (503, "1")
            assert json.loads(body)["error"]["code"] == "starting"
            spec = {"account": "a", "command": "true", "max_runtime_s": 10}
            status, _, body = answer(url + "/v1/bags", "POST", auth, spec)
            assert status == 503 and json.loads(body)["error"]["code"] == "starting"
            status, headers, body = answer(url + "/bags", headers={"Accept": "text/html"})
            assert status == 503 and headers["Content-Type"].startswith("text/html")
            assert b'http-equiv="refresh"' in body

            # systemd hears that it is starting (and asks for more time), not that it is ready.
            said = []
            with pytest.raises(TimeoutError):
                while True:
                    said.append(systemd.recv(4096).decode())
            assert said and all("READY=1" not in s and "STATUS=starting" in s for s in said)
            assert process.poll() is None
            assert json.loads(answer(url + "/healthz")[2])["status"] == "starting"
        assert wait_until_ready(daemon.state_dir, process, daemon.log) == url

        systemd.settimeout(30)
        while not (said := systemd.recv(4096).decode()).startswith("READY=1"):
            assert "STATUS=starting" in said
        status, _, body = answer(url + "/healthz")
        assert status == 200
        assert json.loads(body) == {
            "ok": True,
            "status": "ok",
            "driver": "local",
            "schema_version": json.loads(body)["schema_version"],
        }
        # The submission answered 503 while starting changed nothing.
        assert daemon.client().bags() == []
        assert daemon.stop() == 0


def test_sigterm_while_starting_stops_it_cleanly(make_daemon):
    daemon = make_daemon()
    with database_locked(daemon.state_dir):
        process = daemon.launch()
        url = url_of(daemon.state_dir)
        assert answer(url + "/healthz")[0] == 503
        process.send_signal(signal.SIGTERM)
        # Its store waits for our lock to write what it began; let go once it is told.
        wait_until(lambda: "stopping while starting" in daemon.log(), 60)
    assert process.wait(60) == 0, daemon.log()
    assert not (daemon.state_dir / "api.url").exists()
    assert "stopped" in daemon.log()


def test_a_daemon_that_cannot_start_is_reported_with_its_log_and_never_listens(make_daemon):
    daemon = make_daemon()
    # Another daemon's lock on the state directory: it must give up before it binds.
    with (daemon.state_dir / "lock").open("a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write(str(os.getpid()))
        lock.flush()
        with pytest.raises(RuntimeError) as failed:
            daemon.start()
    message = str(failed.value)
    assert message.startswith("the daemon exited with status 1 before it was ready; its log:")
    assert f"another spotbag daemon (pid {os.getpid()}) is using" in message
    assert not (daemon.state_dir / "api.url").exists()


def test_spotbag_health_says_starting_and_waits_until_ready(make_daemon):
    daemon = make_daemon()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTBAG_")}
    with database_locked(daemon.state_dir):
        process = daemon.launch()
        health = [sys.executable, "-m", "controller.cli", "--url", url_of(daemon.state_dir)]
        health.append("health")
        now = subprocess.run(health, capture_output=True, text=True, cwd=REPO, env=env)
        assert now.returncode == 1 and now.stdout.startswith("starting ("), now
        waiting = subprocess.Popen(
            [*health, "--wait"], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
        )
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(1.0)  # the daemon cannot be ready while the database is held
    out, _ = waiting.communicate(timeout=120)
    assert waiting.returncode == 0 and out.startswith("ok: ready (driver local"), out
    assert process.poll() is None
