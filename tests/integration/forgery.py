"""The forging attempt of issue 23, for the local and the Slurm executor's tests
(test_job_isolation.py, test_slurm_job_isolation.py).

A job of account A looks for account B's attempt ids in other processes' environments
(/proc/*/environ), then writes "0" into B's attempt's exit-status file, a line into
its start marker, and files into B's checkpoint directory and beside B's log, and says
which of these it could do; with the Slurm executor it also submits a Slurm job of its
own named like B's attempt's. B's job writes a line of its own when it really ends, into
a directory only B's user may write: the test holds spotbag's record against it.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from controller.cli.client import Client, ClientError
from tests.conftest import plain_user

# The users of the two accounts (run_as = "spotbag-{account}"), and one both share.
VICTIM, FORGER = "iso-b", "iso-a"
SHARED_USER = "spotbag-iso-shared"
PYTHON = "/usr/bin/python3"  # the system's: job users cannot reach this checkout's venv

FORGER_PROGRAM = r'''
"""Account A's job forging account B's attempt. argv: B's bag id, where spotbag keeps
attempts' files (its state directory; the Slurm executor's shared directory), B's uid,
and with the Slurm executor its partition."""
import errno, os, subprocess, sys

bag, root, victim_uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
found, denied = {}, 0
for pid in os.listdir("/proc"):
    if not pid.isdigit() or int(pid) == os.getpid():
        continue
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        continue
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        denied += owner == victim_uid
        continue
    env = dict(v.split(b"=", 1) for v in data.split(b"\0") if b"=" in v)
    if env.get(b"SPOTBAG_BAG_ID") == bag.encode():
        found[env[b"SPOTBAG_JOB_ID"].decode()] = env[b"SPOTBAG_ATTEMPT"].decode()
print(f"environ found={len(found)} denied={denied}", flush=True)
# What no environment told, the layout does (README): its first job, first attempt.
job, attempt = next(iter(found.items()), (f"{bag}-0", "1"))
logs = os.path.join(root, "logs", bag)
targets = {
    "exit": (os.path.join(logs, f"{job}.{attempt}.exit"), "0\n"),
    "started": (os.path.join(logs, f"{job}.{attempt}.started"), "1\n"),
    "checkpoint": (os.path.join(root, "checkpoints", bag, job, "forged"), "forged\n"),
    "logdir": (os.path.join(logs, f"{job}.{attempt}.forged"), "forged\n"),
}
for what, (path, text) in targets.items():
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as exc:
        print(f"forge {what} denied {errno.errorcode.get(exc.errno, exc.errno)}", flush=True)
    else:
        print(f"forge {what} written", flush=True)
if len(sys.argv) > 4:
    # A Slurm job of A's own, held, named like B's attempt's job (squeue shows every name).
    names = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%j"], capture_output=True, text=True)
    victims = [n for n in names.stdout.split() if n.endswith(f":{job}.{attempt}")]
    made = subprocess.run(
        ["sbatch", "--parsable", "--hold", "-p", sys.argv[4], "-J", victims[0], "--wrap", "sleep 300"],
        capture_output=True,
        text=True,
    ) if victims else None
    if made is not None and made.returncode == 0:
        print(f"impostor {made.stdout.strip()}", flush=True)
    else:
        print(f"impostor failed: {names.stderr.strip()} {made and made.stderr.strip()}", flush=True)
'''


def user_of(account: str) -> pwd.struct_passwd:
    return pwd.getpwnam(plain_user(f"spotbag-{account}"))


@contextmanager
def workspace(victim_user: str) -> Iterator[tuple[Path, Path]]:
    """(the forger's program, the directory where only `victim_user` writes its
    completion lines), in /tmp so that the jobs' users reach them."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="spotbag-forgery-"))
    try:
        base.chmod(0o755)
        program = base / "forge.py"
        program.write_text(FORGER_PROGRAM)
        program.chmod(0o644)
        out = base / "victim"
        out.mkdir(mode=0o700)
        victim = pwd.getpwnam(victim_user)
        os.chown(out, victim.pw_uid, victim.pw_gid)
        yield program, out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def victim_command(out: Path, first_attempt_s: float) -> str:
    """B's job: says it runs, works (long on its first attempt), then writes its own
    completion line, "<job>.<attempt> <time>", where only its user may write."""
    return (
        "echo victim-running; "
        f'if [ "$SPOTBAG_ATTEMPT" = 1 ]; then sleep {first_attempt_s:g}; else sleep 1; fi; '
        f'echo "$SPOTBAG_JOB_ID.$SPOTBAG_ATTEMPT $(date +%s.%N)" >> {out}/done'
    )


def log_of(client: Client, job_id: str) -> str:
    """The job's latest attempt's log so far ("" before it has one)."""
    try:
        return client.log(job_id)[0].decode(errors="replace")
    except ClientError:
        return ""


def forger_command(
    program: Path, victim_bag: str, root: Path, victim_uid: int, partition: str = ""
) -> str:
    return f"{PYTHON} {program} {victim_bag} {root} {victim_uid} {partition}".rstrip()


def completions(out: Path) -> dict[str, float]:
    """The victim's completion lines: attempt id -> when its program ended."""
    done = out / "done"
    text = done.read_text() if done.exists() else ""
    return {a: float(t) for a, t in (line.split() for line in text.splitlines() if line)}


def forger_report(log: str) -> dict[str, str]:
    """What the forger could do: {"environ": "found=N denied=M", "exit": "written" or
    "denied EACCES", ..., "impostor": its Slurm job's id}."""
    report = {}
    for line in log.splitlines():
        if m := re.fullmatch(r"environ (found=\d+ denied=\d+)", line):
            report["environ"] = m.group(1)
        elif m := re.fullmatch(r"forge (\w+) (written|denied \w+)", line):
            report[m.group(1)] = m.group(2)
        elif m := re.fullmatch(r"impostor (.*)", line):
            report["impostor"] = m.group(1)
    return report


def as_run_as(config_text: str, lines: str) -> str:
    """A daemon's config with these [executor] lines."""
    assert "\n[executor]\n" in config_text
    return config_text.replace("\n[executor]\n", f"\n[executor]\n{lines}", 1)
