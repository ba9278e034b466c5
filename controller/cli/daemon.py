"""The daemon and its configuration: `spotbag serve`, `spotbag config defaults|check`."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from controller.cli.common import EXIT_CONFIG, console, err_console
from controller.config import ConfigError, load_config, render_defaults
from controller.executors.job_users import JobUsers


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="SPOTBAG_CONFIG",
    help="TOML configuration file (default: built-in defaults).",
)
@click.option("--host", help="Override api.host.")
@click.option("--port", type=int, help="Override api.port (0: any free port).")
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_context
def serve(
    ctx: click.Context, config_path: str | None, host: str | None, port: int | None, log_level: str
) -> None:
    """Run the controller daemon (stops cleanly on SIGTERM / Ctrl-C)."""
    from controller.service import StateDirBusy, TaskDied
    from controller.service import serve as serve_forever

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        config = load_config(
            config_path, state_dir=ctx.obj["state_dir"], **{"api.host": host, "api.port": port}
        )
    except ConfigError as exc:
        # EX_CONFIG: a supervisor should not restart what only an edit can fix.
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(EXIT_CONFIG)
    try:
        asyncio.run(serve_forever(config))
    except StateDirBusy as exc:
        raise click.ClickException(str(exc)) from None
    except TaskDied as exc:
        # Non-zero: systemd (Restart=on-failure) starts a fresh daemon.
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        sys.exit(1)
    except OSError as exc:
        raise click.ClickException(f"cannot start: {exc}") from None


@click.group()
def config() -> None:
    """Show or check configuration."""


@config.command("defaults")
def config_defaults() -> None:
    """Print every setting with its default and documentation (TOML)."""
    click.echo(render_defaults(), nl=False)


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path: str) -> None:
    """Validate a configuration file and who jobs run as (run_as: the users it names
    exist and are not root); with executor slurm, also check that Slurm is reachable
    and set up for spotbag (partitions, hooks, configless)."""
    from controller.formatting import plural
    from controller.wiring import make_job_users

    try:
        loaded = load_config(path)
        users = make_job_users(loaded, loaded.resolved_state_dir(), as_daemon=False)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    console.print(
        f"{path}: ok ({plural(len(loaded.vm_types), 'VM type')}, driver {loaded.driver.name}, "
        f"executor {loaded.executor.name})",
        highlight=False,
    )
    console.print(f"jobs run as: {describe_job_users(users)}", highlight=False)
    if loaded.executor.name == "slurm":
        from controller.slurm.cli import report_checks
        from controller.slurm.setup import check_slurm

        click.echo("Slurm:")
        if not report_checks(asyncio.run(check_slurm(loaded))):
            raise click.ClickException("Slurm is not ready for spotbag (see above)")


def describe_job_users(users: JobUsers) -> str:
    """Who jobs run as, and whether accounts are kept apart (docs/operations.md#job-isolation)."""
    if not users.configured:
        return "the daemon's user (accounts are not kept apart; run_as sets users)"
    named = ", ".join(f"{a} -> {u}" for a, u in sorted(users.accounts.items()))
    parts = [f"run_as = {users.run_as!r}"] if users.run_as else []
    if named:
        parts.append(f"run_as_accounts: {named}")
    if not users.run_as:
        parts.append("other accounts cannot submit bags")
    apart = "a user per account" if users.per_account else "accounts share a user: not kept apart"
    return f"{'; '.join(parts)} ({apart})"
