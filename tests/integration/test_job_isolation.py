"""What the daemon writes is private, and local jobs cannot read its secrets.

The state directory is 0700 and the database, the token and job logs 0600, also for a
state directory an older version left open. With `[executor] run_as` (the daemon runs
as root) a job runs as that user: it can write its checkpoints, but cannot read the
admin token or the database, nor list the state directory — the attack of issue 14,
where a job printed the token into its log and its account read it back as admin.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from tests.conftest import wait_for_bag

pytestmark = pytest.mark.integration


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_state_directory_and_its_files_are_private(make_daemon):
    daemon = make_daemon()
    daemon.state_dir.chmod(0o755)  # as an older version left it
    client = daemon.start()
    bag = client.submit(
        {"account": "a", "command": "echo hi > $SPOTBAG_CHECKPOINT_DIR/c", "max_runtime_s": 10}
    )
    assert wait_for_bag(client, bag["id"])["state"] == "succeeded"
    state = daemon.state_dir
    assert mode(state) == 0o700
    for name in ("spotbag.db", "token"):
        assert mode(state / name) == 0o600, name
    written = list((state / "logs" / bag["id"]).iterdir())  # the log and its exit status
    assert written and all(mode(f) == 0o600 for f in written), written
    (checkpoint,) = (state / "checkpoints" / bag["id"]).iterdir()
    assert mode(checkpoint) == 0o700 and mode(checkpoint / "c") == 0o600
    assert daemon.stop() == 0


def test_jobs_run_as_the_configured_user_and_cannot_read_the_token(make_daemon):
    if os.geteuid() != 0:
        reason = "running jobs as another user needs the daemon to run as root"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: .ci/run runs the suite as root)")
        pytest.skip(reason)
    nobody = pwd.getpwnam("nobody")
    daemon = make_daemon(token="the-admin-token-" + "x" * 16)
    refused = daemon.start  # pytest's temporary directories are closed to others
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(
        text.replace("[executor]\n", '[executor]\nrun_as = "nobody"\n', 1)
    )
    with pytest.raises(RuntimeError, match="cannot pass through"):
        refused()
    daemon.config_path.write_text(text)
    for above in daemon.state_dir.parents:  # as /var/lib is on a head node
        if above == Path("/tmp"):
            break
        above.chmod(above.stat().st_mode | 0o001)
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(
        text.replace("[executor]\n", '[executor]\nrun_as = "nobody"\n', 1)
    )
    client = daemon.start()
    state = daemon.state_dir
    command = (
        "id -u; "
        f"cat {state}/token || echo cannot-read-token; "
        f"cat {state}/spotbag.db > /dev/null || echo cannot-read-db; "
        f"ls {state} || echo cannot-list-state; "
        "echo saved > $SPOTBAG_CHECKPOINT_DIR/ckpt && echo checkpoint-ok"
    )
    bag = client.submit({"account": "a", "command": command, "max_runtime_s": 10})
    assert wait_for_bag(client, bag["id"])["state"] == "succeeded"
    out = client.log(f"{bag['id']}-0")[0].decode()
    assert out.splitlines()[0] == str(nobody.pw_uid), out
    for line in ("cannot-read-token", "cannot-read-db", "cannot-list-state", "checkpoint-ok"):
        assert line in out, out
    assert "the-admin-token" not in out
    checkpoint = state / "checkpoints" / bag["id"] / f"{bag['id']}-0" / "ckpt"
    assert os.stat(checkpoint).st_uid == nobody.pw_uid
    assert daemon.stop() == 0


def test_run_as_root_is_refused(make_daemon):
    daemon = make_daemon()
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(text.replace("[executor]\n", '[executor]\nrun_as = "root"\n', 1))
    with pytest.raises(RuntimeError, match="must not run as root"):
        daemon.start()
