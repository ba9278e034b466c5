"""What every attempt leaves on disk, whichever executor ran it: the wrapper its
command runs under, its exit-status file beside its log, and the checkpoint files
its job writes.

Both the local and the Slurm executor run a job's command under `WRAPPER`. For the
Slurm executor these files live on the filesystem the head node shares with the
VMs, so the controller reads what a job did on a VM without asking the VM.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from controller.executors.base import AttemptEvent, Outcome

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
# For a job that runs as another user than the daemon (local executor, run_as): it may
# not create files beside its log, so it writes its status into the (empty) file the
# daemon made for it, in one write of a few bytes.
WRAPPER_INTO_GIVEN_FILE = WRAPPER.replace(
    """printf '%s\\n' "$code" > "$2.tmp" && mv "$2.tmp" "$2"\n""",
    """printf '%s\\n' "$code" > "$2"\n""",
)
assert WRAPPER_INTO_GIVEN_FILE != WRAPPER


def exit_status_path(log_path: Path) -> Path:
    """Where the wrapper records an attempt's exit status (beside its log)."""
    return log_path.with_suffix(".exit")


def started_path(log_path: Path) -> Path:
    """Where a Slurm attempt's script notes that its program starts (beside its log):
    from then on a signal reaches the program."""
    return log_path.with_suffix(".started")


def read_exit_status(path: Path) -> tuple[int, float] | None:
    """(exit status, when it was written) of a finished attempt, or None."""
    try:
        return int(path.read_text().strip()), path.stat().st_mtime
    except (OSError, ValueError):
        return None


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
