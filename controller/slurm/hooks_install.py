"""Installing slurm_hooks/ for slurmctld (`spotbag slurm install-hooks`).

Writes, into one directory: the hook program (slurm_hooks/spotbag_hook.py, stdlib
only), one small sh wrapper per hook that slurm.conf names (jobcomp,
prolog_slurmctld, epilog_slurmctld, resume, suspend, resume_fail), the hooks' JSON
config and a copy of the callback secret readable by SlurmUser only.

slurmctld runs hooks with an empty environment, so the wrappers name the config
file; they also filter by partition in sh, so that jobs that are none of spotbag's
business (and spotbag's own jobs, for the prolog) cost slurmctld a fork of /bin/sh
rather than a Python start: per-job hooks are what limits Slurm's throughput.

Directories, whatever the umask: the one holding the hooks' config and secret copy
and the spool (events waiting, signed) are made 0700 and owned by SlurmUser, who
runs the hooks; the hooks' own directory 0755 (slurmctld runs what is there, so only
root may write it). Directories made above them are 0755: SlurmUser must pass
through them. An existing directory others may write to is refused: they could
swap the files slurmctld runs or reads; so is one SlurmUser cannot reach: a hook
that cannot read its config loses every event (it cannot even spool them), and a
slurmctld prolog that cannot be run requeues its job forever.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import stat
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from controller.errors import SpotbagError

HOOKS = ("jobcomp", "prolog_slurmctld", "epilog_slurmctld", "resume", "suspend", "resume_fail")


@dataclass(frozen=True)
class HookInstall:
    dest: Path  # where the hook program and wrappers go
    config_path: Path  # the hooks' JSON config
    url: str  # the controller, as slurmctld's host reaches it
    secret: bytes
    spool_dir: Path
    partition: str = "spotbag"  # spotbag's own jobs
    pool_partitions: Sequence[str] = ()
    slurm_conf: str = ""
    bin_dir: str = "/usr/bin"
    python: str = "/usr/bin/python3"
    timeout_s: float = 5.0  # a pool job's prolog waits for its reservation (about 0.1 s)
    power_up_wait_s: float = 600.0
    owner: tuple[int, int] | None = None  # (uid, gid) of SlurmUser; None: the caller


def hook_program() -> str:
    return resources.files("slurm_hooks").joinpath("spotbag_hook.py").read_text()


def _case(partitions: Sequence[str], variable: str, command: str) -> str:
    if not partitions:
        return "exit 0\n"
    pattern = "|".join(shlex.quote(p) for p in partitions)
    return f'case "${variable}" in\n    {pattern}) exec {command} ;;\nesac\nexit 0\n'


def wrappers(install: HookInstall) -> dict[str, str]:
    """The sh wrapper of each hook."""
    program = install.dest / "spotbag_hook.py"
    run = f"{shlex.quote(install.python)} -IS {shlex.quote(str(program))} {shlex.quote(str(install.config_path))}"
    ours = [install.partition, *install.pool_partitions]
    head = "#!/bin/sh\n# spotbag Slurm hook (controller/slurm/hooks_install.py)\n"
    return {
        # jobcomp/script: every job's final state; only spotbag's partitions matter.
        "jobcomp": head + _case(ours, "PARTITION", f"{run} jobcomp"),
        # Only jobs on power-saving pools need the prolog (it waits for their nodes).
        "prolog_slurmctld": head
        + _case(install.pool_partitions, "SLURM_JOB_PARTITION", f"{run} prolog_slurmctld"),
        "epilog_slurmctld": head + _case(ours, "SLURM_JOB_PARTITION", f"{run} epilog_slurmctld"),
        "resume": head + f'exec {run} resume "$1"\n',
        "suspend": head + f'exec {run} suspend "$1"\n',
        "resume_fail": head + f'exec {run} resume_fail "$1"\n',
    }


class HookDirectoryError(SpotbagError):
    """A directory the hooks' files cannot go into: others may write to it, or SlurmUser
    cannot reach it."""

    code = "hook_directory"


def make_dirs(
    path: Path, mode: int, owner: tuple[int, int] | None = None, *, exclusive: bool = False
) -> None:
    """`path` and any missing parents, made with exact modes whatever the umask (mkdir's
    mode is cut by it, and a umask of 0 makes directories world-writable): `path` gets
    `mode` and `owner`, the parents 0755 and the caller as owner.

    An existing `path` is set to `mode` and `owner` when it is `exclusive`ly ours (the
    spool); otherwise it is left as it is (it may be shared, as /etc/spotbag is with
    spotbag.toml), but refused (HookDirectoryError) if others than its owner may write to
    it: they could swap the files slurmctld runs or reads."""
    if path.is_symlink():
        raise HookDirectoryError(f"{path} is a symbolic link; name the directory itself")
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile: checked below
            directory.mkdir(mode=0o700)
        os.chmod(directory, mode if directory == path else 0o755)
    if not path.is_dir():
        raise HookDirectoryError(f"{path} is not a directory")
    if path in missing or exclusive:
        os.chmod(path, mode)
        if owner is not None:
            os.chown(path, *owner)
    elif path.stat().st_mode & 0o022:
        raise HookDirectoryError(
            f"{path} may be written by others than its owner "
            f"(mode {path.stat().st_mode & 0o7777:04o}): they could swap the hooks' files; "
            f"chmod go-w {path} or choose another directory"
        )


def blocked_at(path: Path, uid: int, groups: Collection[int]) -> Path | None:
    """The first directory above `path` that user `uid` (in `groups`) may not pass
    through, or None."""
    if uid == 0:
        return None
    for directory in reversed(Path(os.path.abspath(path)).parents):
        st = directory.stat()
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            return directory
    return None


def install_hooks(install: HookInstall) -> list[Path]:
    """Write everything; returns the files written."""
    make_dirs(install.dest, 0o755)
    make_dirs(install.config_path.parent, 0o700, install.owner)
    make_dirs(install.spool_dir, 0o700, install.owner, exclusive=True)
    if install.owner is not None:
        # SlurmUser runs the hooks: see the module's docstring for what breaks otherwise.
        uid, gid = install.owner
        name = pwd.getpwuid(uid).pw_name
        groups = set(os.getgrouplist(name, gid))
        for needed in (install.dest / "jobcomp", install.config_path, install.spool_dir / "x"):
            blocked = blocked_at(needed, uid, groups)
            if blocked is not None:
                st = blocked.stat()
                raise HookDirectoryError(
                    f"{name} (SlurmUser, who runs the hooks) cannot pass through {blocked} "
                    f"(mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid}:{st.st_gid}) "
                    f"to reach {needed.parent}: give {name} access (e.g. add it to the "
                    "directory's group) or choose another directory"
                )
    written = []
    program = install.dest / "spotbag_hook.py"
    _write(program, hook_program(), 0o755, install.owner)
    written.append(program)
    for name, text in wrappers(install).items():
        path = install.dest / name
        _write(path, text, 0o755, install.owner)
        written.append(path)
    secret_file = install.config_path.with_name(install.config_path.stem + ".secret")
    _write(secret_file, install.secret.decode() + "\n", 0o600, install.owner)
    config = {
        "url": install.url,
        "secret_file": str(secret_file),
        "spool_dir": str(install.spool_dir),
        "timeout_s": install.timeout_s,
        "slurm_conf": install.slurm_conf,
        "bin_dir": install.bin_dir,
        "pool_partitions": list(install.pool_partitions),
        "power_up_wait_s": install.power_up_wait_s,
    }
    _write(install.config_path, json.dumps(config, indent=2) + "\n", 0o600, install.owner)
    return [*written, secret_file, install.config_path]


def _write(path: Path, text: str, mode: int, owner: tuple[int, int] | None) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)  # a leftover (or a planted link) is not written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)
