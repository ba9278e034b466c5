"""What every attempt leaves on disk, whichever executor ran it: the wrapper its
command runs under, its exit-status file beside its log, and the checkpoint files
its job writes.

Both the local and the Slurm executor run a job's command under `WRAPPER`. For the
Slurm executor these files live on the filesystem the head node shares with the
VMs, so the controller reads what a job did on a VM without asking the VM.

What the daemon reads back (an exit status, a start marker) counts only from a
regular file owned by the attempt's job user that nobody else may write
(`read_owned`); with a user per account (job_users.py) the daemon makes these files
for that user (`hand_over`) where no job can create files, so one account's job
cannot forge another's.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
from collections.abc import Sequence
from pathlib import Path

from controller.executors.base import AttemptEvent, Outcome
from controller.executors.job_users import JobUser

# Every job runs under this POSIX sh wrapper ($1: the command, $2: the exit-status file).
# It runs the command in the background of its own process group, forwards TERM to
# it, and records the command's exit status in $2 once it ends, so that an attempt
# that finishes while the daemon is down is still known to have finished (recover()).
# `wait` returns early when a trapped signal arrives, hence the loop until the command
# is really gone.
# The checkpoint signal, SIGUSR1, goes to the whole process group. The wrapper ignores
# it before it starts the command, so the shells in between (and programs that do not
# checkpoint) inherit "ignore" and live on, while a program that installs a handler
# (Python's signal.signal, C's sigaction) gets it.
IGNORE_CHECKPOINT_SIGNAL = "trap '' USR1\n"
WRAPPER_BODY = """\
/bin/sh -c "$1" &
child=$!
trap 'kill -TERM "$child" 2>/dev/null' TERM
while :; do
    wait "$child"
    code=$?
    kill -0 "$child" 2>/dev/null || break
done
printf '%s\\n' "$code" > "$2.tmp" && mv "$2.tmp" "$2"
exit "$code"
"""
WRAPPER = IGNORE_CHECKPOINT_SIGNAL + WRAPPER_BODY
# For a job that runs as another user than the daemon (`run_as`): it may not create
# files beside its log, so it writes its status into the (empty) file the daemon made
# for it (`hand_over`), in one write of a few bytes; a reader takes it only once its
# line is whole.
WRAPPER_BODY_INTO_GIVEN_FILE = WRAPPER_BODY.replace(
    """printf '%s\\n' "$code" > "$2.tmp" && mv "$2.tmp" "$2"\n""",
    """printf '%s\\n' "$code" > "$2"\n""",
)
assert WRAPPER_BODY_INTO_GIVEN_FILE != WRAPPER_BODY
WRAPPER_INTO_GIVEN_FILE = IGNORE_CHECKPOINT_SIGNAL + WRAPPER_BODY_INTO_GIVEN_FILE
# The local executor's wrapper, whoever the job runs as: the status is written in
# place, made by the daemon or not. The rename of `WRAPPER` execs /bin/mv once per
# attempt (3-4 ms of wall time a job on a busy 4-slot host, bench/local_dispatch.py)
# and buys a local reader nothing: a shell's printf writes its few bytes in one write(),
# and `read_exit_status` takes a status only once its line is whole.
#
# And the command runs in a sub-shell of the wrapper (a fork of a small process) rather
# than in a second /bin/sh (a fork and an exec): one shell started per job instead of
# two (the jobs' CPU 1.8-2.1 -> 1.2 ms a job, bench/local_dispatch.py). The wrapper is
# started with $0
# "/bin/sh", and `set --` empties the positional parameters before the command runs,
# so a job sees what `/bin/sh -c COMMAND` showed it ($0 /bin/sh, $# 0), except
# (docs/architecture.md#job-shell):
# - `$$` is the wrapper's process id (which is also the job's process group and
#   session), `$PPID` the daemon's;
# - the sub-shell handles TERM by `exit 143`, which a shell runs only once the command
#   it waits for has ended: a job's program stopped by TERM gets its grace period
#   (`kill_grace_s`) even under a compound command, and the job ends with 143. What it
#   runs gets TERM's default action as before (a handled signal is reset on exec); a
#   command may set its own `trap ... TERM`;
# - SIGUSR1 is ignored as before, but the command line's own shell may trap it (it was
#   not ignored when the wrapper started), so `trap 'save' USR1; ...` checkpoints.
LOCAL_WRAPPER_BODY = WRAPPER_BODY_INTO_GIVEN_FILE.replace(
    """/bin/sh -c "$1" &\n""", """(trap 'exit 143' TERM; eval "set --; $1") &\n"""
)
assert LOCAL_WRAPPER_BODY != WRAPPER_BODY_INTO_GIVEN_FILE
LOCAL_WRAPPER = IGNORE_CHECKPOINT_SIGNAL + LOCAL_WRAPPER_BODY
_EXIT_LINE = re.compile(rb"[0-9]{1,3}\n")


def exit_status_path(log_path: Path) -> Path:
    """Where the wrapper records an attempt's exit status (beside its log)."""
    return log_path.with_suffix(".exit")


def started_path(log_path: Path) -> Path:
    """Where a Slurm attempt's script notes that its program starts (beside its log):
    from then on a signal reaches the program."""
    return log_path.with_suffix(".started")


def read_owned(path: Path, owner: int, limit: int = 64) -> tuple[bytes, os.stat_result] | None:
    """The first bytes of `path` and its status, if it is a regular file (not a link)
    owned by `owner` that nobody else may write; else None. An attempt's files are
    believed only so: a file another user could have written says nothing of the
    attempt (job_users.py)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not owned_by(status, owner):
            return None
        return os.read(fd, limit), status
    except OSError:
        return None
    finally:
        os.close(fd)


def owned_by(status: os.stat_result, owner: int) -> bool:
    """Whether a file of this status is a regular file of `owner` that only it may write."""
    return stat.S_ISREG(status.st_mode) and status.st_uid == owner and not status.st_mode & 0o022


def read_exit_status(path: Path, owner: int) -> tuple[int, float] | None:
    """(exit status, when it was written) of a finished attempt, or None: the wrapper's
    whole line in a file of `owner`, the attempt's job user (`read_owned`)."""
    found = read_owned(path, owner)
    if found is None or not _EXIT_LINE.fullmatch(found[0]):
        return None
    return int(found[0]), found[1].st_mtime


def read_started(path: Path, owner: int) -> float | None:
    """When a Slurm attempt's program started: the start marker's time, once its script
    wrote its line into it (it may be there empty, made for it: `hand_over`), in a
    file of `owner` (`owned_by`); else None."""
    try:
        status = os.lstat(path)
    except OSError:
        return None
    if not owned_by(status, owner) or status.st_size == 0:
        return None
    return status.st_mtime


def hand_over(
    root: Path,
    checkpoint_dir: Path,
    user: JobUser,
    *,
    markers: Sequence[Path],
    logs: Sequence[Path] = (),
) -> None:
    """Let an attempt's job user reach its job's checkpoint directory and the files it
    writes under `root` (its exit status and start marker, made here empty; its log,
    kept if there) and nothing else of `root`: the directories on the way may be passed
    through (0711, the daemon's: not listed, not written), the checkpoint directory
    is the user's (0700), and so are the files (0600). A job cannot create or replace
    files beside them, so what the daemon reads back there is its own or nobody's."""
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    if checkpoint_dir.is_symlink():
        raise OSError(f"{checkpoint_dir} is a symbolic link")
    files = [*markers, *logs]
    for leaf in (checkpoint_dir, *files):
        leaf.parent.mkdir(parents=True, exist_ok=True)
        path = leaf.parent
        while path != root and root in path.parents:
            path.chmod(0o711)
            path = path.parent
    root.chmod(0o711)
    os.chown(checkpoint_dir, user.uid, user.gid, follow_symlinks=False)
    checkpoint_dir.chmod(0o700)
    for path in files:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if path in markers else 0)
        fd = os.open(path, flags, 0o600)
        try:
            os.fchown(fd, user.uid, user.gid)
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def checkpoint_fingerprint(directory: Path) -> tuple:
    """What identifies the checkpoint files in `directory` now: (name, inode, mtime,
    size) of each, temporary names left out. A rename into place changes the inode."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return ()
    found = []
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(".tmp"):
            continue
        with contextlib.suppress(OSError):
            st = entry.stat(follow_symlinks=False)
            found.append((entry.name, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(sorted(found))


def end_event(
    attempt_id: str,
    max_runtime_s: float,
    code: int | None,
    stop_reason: str,
    timed_out: bool,
    at: float,
) -> AttemptEvent:
    """How an attempt ended, from its wrapper's exit status and why (if) we stopped it."""
    if timed_out:
        return AttemptEvent(
            attempt_id, at, Outcome.TIMED_OUT, code, f"exceeded max_runtime_s={max_runtime_s:g}"
        )
    if stop_reason:
        return AttemptEvent(attempt_id, at, Outcome.KILLED, code, stop_reason)
    if code is None:  # the watcher itself was interrupted
        return AttemptEvent(attempt_id, at, Outcome.KILLED, None, "watch interrupted")
    if code > 128:  # the command died of a signal (sh reports 128 + signal number)
        return AttemptEvent(attempt_id, at, Outcome.EXITED, code, signal_detail(code - 128))
    if code < 0:  # the wrapper itself was killed by a signal nobody here sent
        return AttemptEvent(attempt_id, at, Outcome.EXITED, 128 - code, signal_detail(-code))
    return AttemptEvent(attempt_id, at, Outcome.EXITED, code)


def signal_detail(number: int) -> str:
    """ "killed by signal 9 (Killed)", or "" for a number that is no signal."""
    name = signal.strsignal(number) if 0 < number < 65 else None
    return f"killed by signal {number} ({name})" if name else ""
