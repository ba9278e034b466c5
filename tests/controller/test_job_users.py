"""Who accounts' jobs run as, and which of an attempt's files the daemon believes
(controller/executors/job_users.py, attempt_files.py; issue 23).

A file tells how an attempt went only when it is a regular file of the attempt's job
user that nobody else may write, and only once its line is whole; an account's jobs
run as a user its name does not lead astray (never root, the daemon's user, or,
through a template, a system user); a Slurm job named after an attempt is that
attempt's only when the attempt's user runs it. Real files and the host's own users
(root, nobody, bin); no processes.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from pathlib import Path

import pytest

from controller.config import ConfigError, load_config
from controller.executors.attempt_files import hand_over, read_exit_status, read_started
from controller.executors.job_users import JobUser, JobUserError, JobUsers
from controller.slurm.commands import SlurmTools
from controller.slurm.executor.state import Attempt, SlurmExecutorSettings, SlurmState
from controller.slurm.executor.watch import Watcher, job_rows

NOBODY = pwd.getpwnam("nobody")
ME = os.geteuid()


def needs_root() -> None:
    if ME != 0:
        pytest.skip("giving files to other users needs root")


def write(path: Path, text: str, mode: int = 0o600, owner: int = ME) -> Path:
    path.write_text(text)
    path.chmod(mode)
    if owner != ME:
        os.chown(path, owner, -1)
    return path


def test_an_exit_status_counts_only_from_a_file_of_the_attempts_user(tmp_path):
    mine = write(tmp_path / "a.exit", "0\n")
    assert read_exit_status(mine, ME) == (0, mine.stat().st_mtime)
    assert read_exit_status(write(tmp_path / "b.exit", "137\n"), ME)[0] == 137
    # Not yet whole (the wrapper writes in place into the file made for it), or not one.
    assert read_exit_status(write(tmp_path / "c.exit", "13"), ME) is None
    assert read_exit_status(write(tmp_path / "d.exit", ""), ME) is None
    assert read_exit_status(write(tmp_path / "e.exit", "zero\n"), ME) is None
    # Anybody else could have written these.
    assert read_exit_status(write(tmp_path / "f.exit", "0\n", 0o620), ME) is None
    assert read_exit_status(write(tmp_path / "g.exit", "0\n", 0o602), ME) is None
    assert read_exit_status(mine, ME + 1) is None
    # A link, even to a good file, and a FIFO (which must not hang the reader).
    (tmp_path / "h.exit").symlink_to(mine)
    assert read_exit_status(tmp_path / "h.exit", ME) is None
    os.mkfifo(tmp_path / "i.exit", 0o600)
    assert read_exit_status(tmp_path / "i.exit", ME) is None
    assert read_exit_status(tmp_path / "absent.exit", ME) is None


def test_an_exit_status_of_another_user_counts_only_for_that_user(tmp_path):
    needs_root()
    theirs = write(tmp_path / "a.exit", "0\n", owner=NOBODY.pw_uid)
    assert read_exit_status(theirs, NOBODY.pw_uid) is not None
    assert read_exit_status(theirs, ME) is None


def test_a_start_marker_counts_once_its_line_is_written(tmp_path):
    marker = write(tmp_path / "a.started", "")
    assert read_started(marker, ME) is None  # made for the job, not written by it yet
    write(marker, "4242\n")
    assert read_started(marker, ME) == marker.stat().st_mtime
    assert read_started(marker, ME + 1) is None
    assert read_started(write(tmp_path / "b.started", "1\n", 0o666), ME) is None


def test_hand_over_gives_the_user_its_files_and_nothing_beside_them(tmp_path):
    needs_root()
    root = tmp_path / "shared"
    user = JobUser(NOBODY.pw_name, NOBODY.pw_uid, NOBODY.pw_gid)
    log = root / "logs" / "b1" / "b1-0.1.log"
    checkpoints = root / "checkpoints" / "b1" / "b1-0"
    markers = [log.with_suffix(".started"), log.with_suffix(".exit")]
    root.mkdir()
    log.parent.mkdir(parents=True)
    log.write_text("from an earlier look\n")
    markers[1].write_text("0\n")  # a stale status is emptied
    hand_over(root, checkpoints, user, markers=markers, logs=[log])
    for directory in (root, root / "logs", log.parent, root / "checkpoints", checkpoints.parent):
        st = directory.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (ME, 0o711), directory
    st = checkpoints.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (user.uid, user.gid, 0o700)
    for path in (*markers, log):
        st = path.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (user.uid, 0o600), path
    assert log.read_text() == "from an earlier look\n"
    assert [m.read_text() for m in markers] == ["", ""]
    (checkpoints.parent / "elsewhere").mkdir()
    link = checkpoints.parent / "link"
    link.symlink_to(checkpoints.parent / "elsewhere")
    with pytest.raises(OSError, match="symbolic link"):
        hand_over(root, link, user, markers=[])


def test_accounts_run_as_the_users_the_settings_name():
    users = JobUsers("{account}body", daemon_uid=12345)
    assert users.configured and users.per_account
    assert users.for_account("no") == JobUser("nobody", NOBODY.pw_uid, NOBODY.pw_gid, NOBODY.pw_dir)
    assert users.owner("no") == NOBODY.pw_uid
    assert [u.name for u in users.known()] == ["nobody"]
    # run_as_accounts first; the user it gives an account is that account's alone.
    users = JobUsers("{account}body", {"lab": "nobody"}, daemon_uid=12345)
    assert users.for_account("lab").uid == NOBODY.pw_uid
    with pytest.raises(JobUserError, match="run_as_accounts gives to lab"):
        users.for_account("no")
    assert not JobUsers("", {"lab": "nobody", "chem": "nobody"}).per_account
    # Nothing set: jobs run as the daemon's user, whose files are believed.
    plain = JobUsers(daemon_uid=12345)
    assert not plain.configured and plain.for_account("lab") is None
    assert plain.owner("lab") == 12345
    assert JobUsers("spotbag-{account}").per_account
    assert not JobUsers("spotbag-jobs").per_account


@pytest.mark.parametrize(
    ("users", "account", "why"),
    [
        (JobUsers("spotbag-{account}"), "no-such-account-x", "does not exist .*useradd"),
        (JobUsers("{account}t", daemon_uid=12345), "roo", "must not run as root"),
        (JobUsers("", {"lab": "root"}, daemon_uid=12345), "lab", "must not run as root"),
        (JobUsers("{account}y", daemon_uid=NOBODY.pw_uid), "nobod", "the daemon's own user"),
        # A template reaches only regular users: "bin" (uid 2) is the system's.
        (JobUsers("{account}n", daemon_uid=12345), "bi", "system user"),
        (JobUsers("", {"lab": "nobody"}), "other", "no user to run its jobs as"),
    ],
)
def test_an_account_without_a_proper_user_is_refused(users, account, why):
    with pytest.raises(JobUserError, match=why):
        users.for_account(account)
    assert users.owner(account) == -1  # none of its files is believed
    problem = users.problem(account)
    assert problem is not None and re.search(why, problem)


def test_a_system_user_named_outright_may_run_jobs():
    bin_user = pwd.getpwnam("bin")
    users = JobUsers("", {"legacy": "bin"}, daemon_uid=12345)
    assert users.for_account("legacy").uid == bin_user.pw_uid


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ('run_as = "{account}"', "fixed part"),
        ('run_as = "a-{account}-{account}"', "once"),
        ('run_as = "spotbag-{acct}"', "only {account}"),
        ('run_as = "spot bag"', "no spaces"),
        ('run_as_accounts = {"bad name" = "alice"}', "not an account name"),
        ('run_as_accounts = {lab = ""}', "no user named"),
        ('run_as_accounts = {lab = "x-{account}"}', "no place here"),
    ],
)
def test_the_configuration_refuses_users_that_cannot_be_meant(tmp_path, lines, why):
    path = tmp_path / "c.toml"
    path.write_text(f"[executor]\n{lines}\n")
    with pytest.raises(ConfigError, match=why):
        load_config(path)


def test_a_slurm_job_is_an_attempts_only_when_the_attempts_user_runs_it(tmp_path):
    """A job of another account may name itself after an attempt (job names are free
    and squeue shows them to all): it is never taken for the attempt's job, even with
    a higher id, nor for an attempt this executor does not track."""
    me = str(os.getuid())
    state = SlurmState(
        SlurmExecutorSettings(shared_dir=tmp_path),
        SlurmTools(),
        "c0ffee",
        time.time,
        JobUsers("{account}body", daemon_uid=12345),
    )
    log = tmp_path / "b1-0.1.log"
    state.track(Attempt("b1-0.1", "vm-1", "sb-vm-1", log, None, 60.0, owner=NOBODY.pw_uid))
    nobody = str(NOBODY.pw_uid)
    rows = job_rows(
        f"7|RUNNING|None|2024-01-01T00:00:00|{nobody}|sb:c0ffee:b1-0.1\n"
        f"9|RUNNING|None|2024-01-01T00:00:00|{me}|sb:c0ffee:b1-0.1\n"
        f"8|PENDING|None|N/A|{me}|sb:c0ffee:b1-5.1\n"
        f"10|PENDING|None|N/A|{nobody}|sb:c0ffee:b1-6.1|{nobody}\n"
    )
    assert rows[3][4:] == (f"sb:c0ffee:b1-6.1|{nobody}", nobody)  # a name may hold "|"
    named = [("b1-0.1", rows[0]), ("b1-0.1", rows[1]), ("b1-5.1", rows[2]), ("b1-6.1", rows[3])]
    # squeue is asked for the jobs of the users jobs run as (here: nobody alone).
    assert state.squeue_users() == ["-u", nobody]
    watcher = Watcher(state, None, lambda attempt, why: None)  # type: ignore[arg-type]
    # Not job 9 (another user's, though newer), nor the untracked one of uid `me`; the
    # untracked one of a job user is (an orphan to cancel).
    assert watcher.latest_owned(named) == {"b1-0.1": rows[0], "b1-6.1": rows[3]}
