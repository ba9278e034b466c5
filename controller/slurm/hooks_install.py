"""Installing slurm_hooks/ for slurmctld (`spotbag slurm install-hooks`).

Writes, into one directory: the hook program (slurm_hooks/spotbag_hook.py, stdlib
only), one small sh wrapper per hook that slurm.conf names (jobcomp,
prolog_slurmctld, epilog_slurmctld, resume, suspend, resume_fail), the hooks' JSON
config and a copy of the callback secret readable by SlurmUser only.

slurmctld runs hooks with an empty environment, so the wrappers name the config
file; they also filter by partition in sh, so that jobs that are none of spotbag's
business (and spotbag's own jobs, for the prolog) cost slurmctld a fork of /bin/sh
rather than a Python start: per-job hooks are what limits Slurm's throughput.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

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


def install_hooks(install: HookInstall) -> list[Path]:
    """Write everything; returns the files written."""
    install.dest.mkdir(parents=True, exist_ok=True)
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
    install.spool_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if install.owner is not None:
        os.chown(install.spool_dir, *install.owner)
    return [*written, secret_file, install.config_path]


def _write(path: Path, text: str, mode: int, owner: tuple[int, int] | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)
