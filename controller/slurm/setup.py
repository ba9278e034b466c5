"""Setting a head node's Slurm up for spotbag, and checking it: what the `spotbag slurm`
commands (conf, install-hooks; their click group is controller/slurm/cli.py) write, and
what `spotbag config check` verifies when the executor is Slurm.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from controller.config import Config, ConfigError
from controller.slurm.commands import SlurmError, key_values
from controller.slurm.conf import FragmentSettings, fragment
from controller.slurm.hooks_install import HookInstall, make_dirs
from controller.slurm.pools import PoolBook

DEFAULT_HOOKS_DIR = "/usr/local/lib/spotbag/slurm-hooks"
DEFAULT_HOOK_CONFIG = "/etc/spotbag/slurm-hooks.json"
DEFAULT_SPOOL = "/var/spool/spotbag-hooks"


def hook_secret_path(config: Config) -> Path:
    configured = config.slurm.hook_secret_file
    return Path(configured) if configured else config.resolved_state_dir() / "slurm-hook.secret"


def read_or_make_secret(path: Path, owner: tuple[int, int] | None = None) -> bytes:
    """The daemon's hook secret (made, mode 0600, when missing: the daemon does the same).
    Made before the daemon's first start (by `install-hooks`, as root), it and a
    directory made for it (the daemon's state directory, by default) are 0700 and
    `owner`'s, the daemon's user (SlurmUser: deploy/spotbag-slurm.conf)."""
    if not path.exists():
        make_dirs(path.parent, 0o700, owner)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        if owner is not None:
            os.chown(path, *owner)
    return path.read_bytes().strip()


def fragment_for(config: Config, hooks_dir: str) -> str:
    """What `spotbag slurm conf` prints for `config`: the tests' cluster is built from
    it too (tests/slurm_cluster.py), so they run what users run."""
    pools = PoolBook(config.slurm.pools, config.catalog())
    return fragment(
        FragmentSettings(
            partition=config.slurm.partition,
            node_feature=config.slurm.node_feature,
            hooks_dir=hooks_dir,
            pools=[p.conf for p in pools.pools],
            cred_expire_s=config.slurm.cred_expire_s,
            munge_socket=config.slurm.munge_socket,
        )
    )


def hook_install_for(
    config: Config,
    *,
    dest: Path,
    config_path: Path,
    url: str,
    secret: bytes,
    spool_dir: Path,
    python: str,
    owner: tuple[int, int] | None = None,
) -> HookInstall:
    """What `spotbag slurm install-hooks` installs for `config` (the tests' cluster
    installs the same): the hooks pass on spotbag's partitions only, and the prolog
    waits for a pool node's power-up as long as Slurm does (the longest ResumeTimeout)."""
    pools = PoolBook(config.slurm.pools, config.catalog())
    return HookInstall(
        dest=dest,
        config_path=config_path,
        url=url,
        secret=secret,
        spool_dir=spool_dir,
        partition=config.slurm.partition,
        pool_partitions=pools.partitions,
        slurm_conf=config.slurm.slurm_conf or os.environ.get("SLURM_CONF", ""),
        bin_dir=config.slurm.bin_dir or os.path.dirname(shutil.which("sinfo") or "/usr/bin/sinfo"),
        python=python,
        power_up_wait_s=float(max((p.resume_timeout_s for p in pools.pools), default=600)),
        owner=owner,
    )


@dataclass
class Check:
    what: str
    ok: bool
    detail: str


async def check_slurm(config: Config) -> list[Check]:
    """Is the Slurm the configuration names there, and set up for spotbag?"""
    from controller.wiring import discover_conf_server, slurm_tools

    tools = slurm_tools(config)
    slurm = config.slurm
    found: list[Check] = []
    if slurm.slurm_conf and not Path(slurm.slurm_conf).is_file():
        # Without it the commands look for a configuration server in DNS and time out.
        return [Check("slurmctld answers", False, f"slurm_conf {slurm.slurm_conf}: no such file")]
    try:
        ping = await tools.run("scontrol", "ping")
        found.append(Check("slurmctld answers", "UP" in ping, ping.strip()))
        shown = await tools.run("scontrol", "show", "config")
    except SlurmError as exc:
        return [Check("slurmctld answers", False, str(exc))]
    settings = {
        key.strip(): value.strip()
        for key, _, value in (line.partition("=") for line in shown.splitlines())
        if value
    }
    params = settings.get("SlurmctldParameters", "")
    found.append(
        Check(
            "configless and cloud_reg_addrs",
            "enable_configless" in params and "cloud_reg_addrs" in params,
            f"SlurmctldParameters = {params or '(none)'}",
        )
    )
    try:
        server = slurm.conf_server or await discover_conf_server(tools)
        found.append(Check("where VMs fetch slurm.conf", True, server))
    except ConfigError as exc:
        found.append(Check("where VMs fetch slurm.conf", False, str(exc)))
    for partition in [slurm.partition, *(p.partition for p in slurm.pools)]:
        try:
            line = await tools.run("scontrol", "-o", "show", "partition", partition)
            shown_nodes = key_values(line.strip()).get("Nodes", "")
            found.append(Check(f"partition {partition}", True, f"Nodes={shown_nodes}"))
        except SlurmError as exc:
            found.append(Check(f"partition {partition}", False, str(exc)))
    jobcomp = settings.get("JobCompLoc", "")
    found.append(
        Check(
            "jobcomp hook",
            settings.get("JobCompType") == "jobcomp/script" and os.access(jobcomp, os.X_OK),
            f"JobCompType = {settings.get('JobCompType')}, JobCompLoc = {jobcomp or '(none)'}",
        )
    )
    if slurm.pools:
        resume = settings.get("ResumeProgram", "")
        found.append(Check("ResumeProgram hook", os.access(resume, os.X_OK), resume or "(none)"))
    if not slurm.munge_key:
        found.append(Check("munge key source", False, "[slurm] munge_key is empty"))
    else:
        found.append(Check("munge key source", True, slurm.munge_key))
    secret = hook_secret_path(config)
    found.append(
        Check(
            "hook secret",
            secret.exists() or not secret.parent.exists() or os.access(secret.parent, os.W_OK),
            f"{secret} ({'exists' if secret.exists() else 'made at the first start'})",
        )
    )
    return found
