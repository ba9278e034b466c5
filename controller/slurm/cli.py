"""`spotbag slurm conf|install-hooks`: set a head node's Slurm up for spotbag (executor
slurm), and how `spotbag config check` prints its Slurm checks. What they write and
check is controller/slurm/setup.py."""

from __future__ import annotations

import pwd
from pathlib import Path

import click

from controller.config import ConfigError, load_config
from controller.slurm.hooks_install import HookDirectoryError, install_hooks
from controller.slurm.pools import PoolBook
from controller.slurm.setup import (
    DEFAULT_HOOK_CONFIG,
    DEFAULT_HOOKS_DIR,
    DEFAULT_SPOOL,
    Check,
    fragment_for,
    hook_install_for,
    hook_secret_path,
    read_or_make_secret,
)


@click.group("slurm")
def slurm_group() -> None:
    """Set a head node's Slurm up for spotbag (executor slurm)."""


@slurm_group.command("conf")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="spotbag.toml")
@click.option("--hooks-dir", default=DEFAULT_HOOKS_DIR, show_default=True)
def slurm_conf(config_path: str | None, hooks_dir: str) -> None:
    """Print the lines slurm.conf needs: spotbag's partition of dynamic nodes, the
    callback hooks, and the power-saving pools of [[slurm.pools]]."""
    try:
        config = load_config(config_path)
        click.echo(fragment_for(config, hooks_dir), nl=False)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@slurm_group.command("install-hooks")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="spotbag.toml")
@click.option("--dest", default=DEFAULT_HOOKS_DIR, show_default=True, help="Where hooks go.")
@click.option("--hook-config", default=DEFAULT_HOOK_CONFIG, show_default=True)
@click.option(
    "--spool", default=DEFAULT_SPOOL, show_default=True, help="Where undelivered events wait."
)
@click.option("--url", help="The controller as slurmctld's host reaches it; default: from [api].")
@click.option("--owner", default="slurm", show_default=True, help="SlurmUser, who runs the hooks.")
@click.option("--python", default="/usr/bin/python3", show_default=True)
def slurm_install_hooks(
    config_path: str | None,
    dest: str,
    hook_config: str,
    spool: str,
    url: str | None,
    owner: str,
    python: str,
) -> None:
    """Install slurm_hooks/ for slurmctld (run as root on the head node), with a copy of
    the daemon's hook secret only SlurmUser can read. Restart slurmctld afterwards."""
    try:
        config = load_config(config_path)
        PoolBook(config.slurm.pools, config.catalog())  # a bad pool is refused before any write
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        user = pwd.getpwnam(owner)
    except KeyError:
        raise click.ClickException(f"no user {owner!r} (SlurmUser) on this host") from None
    host = config.api.host if config.api.host not in ("0.0.0.0", "::") else "127.0.0.1"
    owner_ids = (user.pw_uid, user.pw_gid)
    try:
        written = install_hooks(
            hook_install_for(
                config,
                dest=Path(dest),
                config_path=Path(hook_config),
                url=url or f"http://{host}:{config.api.port}",
                secret=read_or_make_secret(hook_secret_path(config), owner_ids),
                spool_dir=Path(spool),
                python=python,
                owner=owner_ids,
            )
        )
    except HookDirectoryError as exc:
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(f"wrote {path}")
    click.echo("slurm.conf needs these lines (`spotbag slurm conf`), then restart slurmctld.")


def report_checks(checks: list[Check]) -> bool:
    for check in checks:
        mark = "ok " if check.ok else "NO "
        click.echo(f"  {mark} {check.what}: {check.detail}")
    return all(c.ok for c in checks)
