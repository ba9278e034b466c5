"""The `spotbag` command.

`serve` runs the daemon; `simulate` runs a bag on a virtual clock; `config`
prints or checks configuration; the offline tools (fit, checkpoint-plan, prepaid,
split-cost, index, simulate-hopping) read files; every other command talks to a
daemon over HTTP (--url / SPOTBAG_URL, --token / SPOTBAG_TOKEN, or the api.url and
token files of --state-dir / SPOTBAG_STATE_DIR on this host).

Subcommands are loaded lazily (click's documented lazy group): the group knows each
one by the module that defines it and imports that module only when the command
runs or its help is shown, so `spotbag status` does not pay for scipy, matplotlib
or the daemon. The modules, by area:

- `bags`: submit, status, watch, cancel, jobs, logs, vms, hopping, preempt, report
- `accounts`: accounts (create, credit, show, list, ledger) and their tokens
- `daemon`: serve, config (defaults, check)
- `offline`: simulate, fit, checkpoint-plan, split-cost
- `hopping`: index, simulate-hopping
- `prepaid`: prepaid
- `slurm`: slurm (conf, install-hooks)
- `data`: data (list, path): where the shipped reference data is

`client` is the HTTP client, `specfile` reads bag specs (YAML or JSON) for `submit`
and `simulate`, `render` the tables and text summaries, `common` what every command
module shares (consoles, exit codes, error reporting).

Exit codes: 0 success; 1 the daemon could not be reached or an internal error;
2 the request or its input file was refused (bad input, not found, ...); 3 `watch`/`submit
--watch` saw the bag end with failed or cancelled jobs; 78 `serve` was given a
configuration it cannot use.
"""

from __future__ import annotations

import importlib
import sys

import click

from controller import __version__

# Command name -> "module:attribute" of its click command, imported on first use.
COMMANDS = {
    "serve": "controller.cli.daemon:serve",
    "config": "controller.cli.daemon:config",
    "submit": "controller.cli.bags:submit",
    "status": "controller.cli.bags:status",
    "watch": "controller.cli.bags:watch",
    "cancel": "controller.cli.bags:cancel",
    "jobs": "controller.cli.bags:jobs",
    "logs": "controller.cli.bags:logs",
    "vms": "controller.cli.bags:vms",
    "hopping": "controller.cli.bags:hopping",
    "preempt": "controller.cli.bags:preempt",
    "report": "controller.cli.bags:report",
    "accounts": "controller.cli.accounts:accounts",
    "simulate": "controller.cli.offline:simulate",
    "fit": "controller.cli.offline:fit_command",
    "checkpoint-plan": "controller.cli.offline:checkpoint_plan_command",
    "split-cost": "controller.cli.offline:split_cost_command",
    "prepaid": "controller.cli.prepaid:prepaid_command",
    "index": "controller.cli.hopping:index_command",
    "simulate-hopping": "controller.cli.hopping:simulate_hopping_command",
    "slurm": "controller.cli.slurm:slurm_group",
    "data": "controller.cli.data:data_group",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first asked for (click docs,
    "Advanced Groups and Context: Lazily Loading Subcommands")."""

    def __init__(self, *args, lazy_subcommands: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def _load(self, cmd_name: str) -> click.Command:
        module_name, attribute = self.lazy_subcommands[cmd_name].split(":")
        command = getattr(importlib.import_module(module_name), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{module_name}.{attribute} is not a click command")
        return command


@click.group(
    cls=LazyGroup,
    lazy_subcommands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--url",
    envvar="SPOTBAG_URL",
    help="Daemon URL (default: STATE_DIR/api.url, else http://127.0.0.1:8787).",
)
@click.option("--token", envvar="SPOTBAG_TOKEN", help="Bearer token (default: STATE_DIR/token).")
@click.option(
    "--state-dir",
    envvar="SPOTBAG_STATE_DIR",
    type=click.Path(file_okay=False),
    help="State directory of the daemon (where api.url and token are found).",
)
@click.version_option(__version__, "--version", "-V", prog_name="spotbag")
@click.pass_context
def cli(ctx: click.Context, url: str | None, token: str | None, state_dir: str | None) -> None:
    """spotbag: run bags of jobs on preemptible (spot) VMs."""
    from controller.cli.client import Client

    ctx.ensure_object(dict)
    ctx.obj["state_dir"] = state_dir
    ctx.obj["client"] = Client.discover(url, token, state_dir)


def main() -> None:
    """The `spotbag` command. Commands word the errors they expect themselves; any
    other error of spotbag's (controller.errors.SpotbagError) ends the command with its
    message and its exit_code instead of a traceback."""
    from controller.errors import SpotbagError

    try:
        cli(obj={})
    except SpotbagError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
