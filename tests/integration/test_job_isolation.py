"""What the daemon writes is private, local jobs cannot read its secrets, and one
account's jobs cannot forge another's results.

The state directory is 0700 and the database, the token and job logs 0600, also for a
state directory an older version left open. With `[executor] run_as` (the daemon runs
as root) a job runs as that user: it can write its checkpoints, but cannot read the
admin token or the database, nor list the state directory — the attack of issue 14,
where a job printed the token into its log and its account read it back as admin.
With `run_as = "spotbag-{account}"` a job of one account cannot read another
account's attempt ids nor write its exit status or checkpoints — the attack of issue
23, where such a job made recovery record an unfinished job of another account as
succeeded (tests/integration/forgery.py; test_slurm_job_isolation.py for Slurm).
"""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from controller.cli.client import ClientError
from tests.conftest import REPO, plain_user, wait_for_bag, wait_until
from tests.integration.forgery import (
    FORGER,
    SHARED_USER,
    VICTIM,
    as_run_as,
    completions,
    forger_command,
    forger_report,
    log_of,
    user_of,
    victim_command,
    workspace,
)

pytestmark = pytest.mark.integration


def require_root() -> None:
    if os.geteuid() != 0:
        reason = "running jobs as other users needs the daemon to run as root"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: .ci/run runs the suite as root)")
        pytest.skip(reason)


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


def test_jobs_run_as_the_configured_user_and_cannot_read_the_token(make_daemon, passable_dir):
    require_root()
    nobody = pwd.getpwnam("nobody")
    closed = make_daemon()  # pytest's temporary directories are closed to others
    closed.config_path.write_text(as_run_as(closed.config_path.read_text(), 'run_as = "nobody"\n'))
    with pytest.raises(RuntimeError, match="cannot pass through"):
        closed.start()
    # As /var/lib is on a head node.
    daemon = make_daemon(token="the-admin-token-" + "x" * 16, base=passable_dir)
    daemon.config_path.write_text(as_run_as(daemon.config_path.read_text(), 'run_as = "nobody"\n'))
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


@pytest.mark.parametrize("users", ["per-account", "shared"])
def test_a_job_of_one_account_cannot_forge_the_result_of_anothers(make_daemon, passable_dir, users):
    """Issue 23 against the local executor: account B's job runs (60 s on its first
    attempt); account A's job looks for B's attempt ids in /proc/*/environ and writes
    "0" into B's exit-status file, into its start marker and checkpoint directory and
    beside its log; then the daemon is killed (SIGKILL) and started again while B's
    program still works, and recovery reads back what it finds.

    With a user per account, A finds nothing and every write is refused; recovery
    finds no exit status of B (it was not written) and B's killed attempt runs again:
    every attempt of B recorded succeeded has B's own completion line, written before
    it was recorded ended. With both accounts sharing one user the same job does forge
    B's success: that run shows this test catches the forgery it guards against."""
    require_root()
    if users == "per-account":
        victim_user, forger_user = user_of(VICTIM), user_of(FORGER)
        lines = 'run_as = "spotbag-{account}"\n'
    else:
        victim_user = forger_user = pwd.getpwnam(plain_user(SHARED_USER))
        lines = f'run_as_accounts = {{{VICTIM} = "{SHARED_USER}", {FORGER} = "{SHARED_USER}"}}\n'
    daemon = make_daemon(base=passable_dir)
    daemon.config_path.write_text(as_run_as(daemon.config_path.read_text(), lines))
    with workspace(victim_user.pw_name) as (program, out):
        client = daemon.start()
        victim = client.submit(
            {"account": VICTIM, "command": victim_command(out, 60), "max_runtime_s": 120}
        )
        job = f"{victim['id']}-0"
        wait_until(lambda: "victim-running" in log_of(client, job), 30, 0.1, "B's job to run")
        forger = client.submit(
            {
                "account": FORGER,
                "command": forger_command(
                    program, victim["id"], daemon.state_dir, victim_user.pw_uid
                ),
                "max_runtime_s": 60,
            }
        )
        assert wait_for_bag(client, forger["id"])["state"] == "succeeded"
        said = log_of(client, f"{forger['id']}-0")
        report = forger_report(said)
        assert set(report) == {"environ", "exit", "started", "checkpoint", "logdir"}, said
        assert completions(out) == {}  # B's program is still at work
        forged = daemon.state_dir / "checkpoints" / victim["id"] / job / "forged"

        daemon.stop(signal.SIGKILL)
        client = daemon.start()
        assert wait_for_bag(client, victim["id"], 120)["state"] == "succeeded"
        attempts = client.job(job)["attempt_list"]
        ended = completions(out)
        recorded = {f"{job}.{a['number']}": a for a in attempts if a["state"] == "succeeded"}

    if users == "shared":
        # One user for both accounts: A read B's attempt from its environment, wrote its
        # exit status and checkpoint, and recovery took B's unfinished attempt 1 for a
        # success.
        assert report["environ"].startswith("found=1 "), said
        assert (report["exit"], report["checkpoint"]) == ("written", "written"), said
        assert f"{job}.1" in recorded and f"{job}.1" not in ended, (recorded, ended)
        assert daemon.stop() == 0
        return
    assert forger_user.pw_uid != victim_user.pw_uid
    # A saw B's processes but not their environment, and could write nothing of B's.
    found, denied = report["environ"].split()
    assert found == "found=0" and int(denied.partition("=")[2]) >= 1, said
    for what in ("exit", "started", "checkpoint", "logdir"):
        assert report[what] == "denied EACCES", said
    assert not forged.exists()
    # Every success spotbag recorded is one B's program reached, and none is recorded
    # before B's program wrote its line.
    assert recorded, attempts
    for attempt_id, attempt in recorded.items():
        assert attempt_id in ended, f"{attempt_id} recorded succeeded, but its program never ended"
        assert attempt["ended_at"] >= ended[attempt_id] - 0.05, (attempt, ended)
    # The attempt the restart killed is not among them: it ran again.
    assert attempts[0]["state"] != "succeeded" and f"{job}.1" not in ended, attempts
    assert daemon.stop() == 0


def test_a_bag_whose_account_has_no_user_is_refused_at_admission(make_daemon, passable_dir):
    """A user is looked up when its account's bag comes: a missing one refuses the bag
    (what an admin would create is in the message), not each of its attempts later."""
    require_root()
    user_of(FORGER)
    daemon = make_daemon(base=passable_dir)
    daemon.config_path.write_text(
        as_run_as(daemon.config_path.read_text(), 'run_as = "spotbag-{account}"\n')
    )
    client = daemon.start()
    bag = {"command": "true", "max_runtime_s": 10}
    with pytest.raises(ClientError) as refused:
        client.submit({**bag, "account": "iso-no-such-user"})
    assert (refused.value.status, refused.value.code) == (422, "no_job_user")
    assert (
        "useradd" in refused.value.message and "spotbag-iso-no-such-user" in refused.value.message
    )
    assert client.bags() == []
    done = wait_for_bag(client, client.submit({**bag, "account": FORGER})["id"])
    assert done["state"] == "succeeded"
    assert daemon.stop() == 0


def test_config_check_says_who_jobs_run_as(tmp_path, passable_dir):
    """`spotbag config check` refuses users that do not exist or are root, and a state
    directory they cannot reach, and says whether accounts are kept apart."""

    def check(lines: str, state: Path = passable_dir / "state") -> subprocess.CompletedProcess:
        path = tmp_path / "c.toml"
        path.write_text(f'state_dir = "{state}"\n[executor]\n{lines}\n')
        return subprocess.run(
            [sys.executable, "-m", "controller.cli", "config", "check", str(path)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )

    apart = check('run_as = "spotbag-{account}"')
    assert apart.returncode == 0 and "a user per account" in apart.stdout, apart
    shared = check('run_as = "nobody"')
    assert shared.returncode == 0 and "accounts share a user" in shared.stdout, shared
    missing = check('run_as_accounts = {lab = "spotbag-iso-no-such-user"}')
    assert missing.returncode == 1 and "does not exist" in missing.stderr, missing
    root = check('run_as_accounts = {lab = "root"}')
    assert root.returncode == 1 and "must not run as root" in root.stderr, root
    closed = check('run_as = "spotbag-{account}"', tmp_path / "state")  # pytest's: 0700
    assert closed.returncode == 1 and "cannot pass through" in closed.stderr, closed
