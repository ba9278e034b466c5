"""The `spotbag` command.

`serve` runs the daemon; `simulate` runs a bag on a virtual clock; `config`
prints or checks configuration; the offline tools (fit, checkpoint-plan, prepaid,
split-cost, index, simulate-hopping) read files; every other command talks to a
daemon over HTTP (--url / SPOTBAG_URL, --token / SPOTBAG_TOKEN, or the api.url and
token files of --state-dir / SPOTBAG_STATE_DIR on this host).

Subcommands are loaded lazily (click's documented lazy group): the group knows each
one by the module that defines it and its one-line help (`COMMANDS`), lists them from
that table, and imports a command's module only when that command runs or its own help
is shown. So `spotbag --help` costs what click does, and `spotbag status` imports the
HTTP client, not scipy, pydantic, matplotlib or the daemon (issue 24). The modules (here
unless a dotted path says where), by area:

- `status`: status (the client and the plain-text summary only)
- `health`: health (is the daemon ready: GET /healthz; `--wait` until it is)
- `bags`: submit, watch, cancel, jobs, logs, vms, hopping, preempt, report
- `accounts`: accounts (create, credit, set, show, list, ledger) and their tokens
- `events`: events (the events of bags and the fleet; --follow) and bags (set: a budget)
- `daemon`: serve, config (defaults, check)
- `offline`: simulate, fit, checkpoint-plan, split-cost
- `hopping`: index, simulate-hopping
- `prepaid`: prepaid
- `controller.slurm.cli`: slurm (conf, install-hooks), with the rest of Slurm
- `data`: data (list, path): where the shipped reference data is

`client` is the HTTP client, `specfile` reads bag specs (YAML or JSON) for `submit`
and `simulate`, `render` the tables and text summaries, `common` what every command
module shares (consoles, made on first use; exit codes, error reporting).

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

# Command name -> (its click command as "module:attribute", imported on first use; its
# one-line help). The helps are written here so that `spotbag --help` imports no command
# module (tests/controller/test_cli_commands.py checks each against its command's own).
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": (
        "controller.cli.daemon:serve",
        "Run the controller daemon (stops cleanly on SIGTERM / Ctrl-C).",
    ),
    "config": ("controller.cli.daemon:config", "Show or check configuration."),
    "health": (
        "controller.cli.health:health",
        "Whether the daemon is ready (exit 0), starting or failing (exit 1): GET /healthz.",
    ),
    "submit": ("controller.cli.bags:submit", "Submit the bag in SPEC_FILE (YAML or JSON)."),
    "status": (
        "controller.cli.status:status",
        "Show one bag (counts, progress, usage, cost) or list recent bags.",
    ),
    "watch": (
        "controller.cli.bags:watch",
        "Show a live progress bar until BAG_ID finishes, then its summary.",
    ),
    "cancel": (
        "controller.cli.bags:cancel",
        "Cancel BAG_ID: queued jobs are cancelled and running ones stopped.",
    ),
    "jobs": ("controller.cli.bags:jobs", "List the jobs of BAG_ID."),
    "logs": ("controller.cli.bags:logs", "Print the output of JOB_ID's latest (or given) attempt."),
    "vms": ("controller.cli.bags:vms", "List VMs and the fleet's VM-hours and cost."),
    "hopping": (
        "controller.cli.bags:hopping",
        "Spot hopping: the live market per VM type and the latest migrations.",
    ),
    "preempt": (
        "controller.cli.bags:preempt",
        "Preempt VM_ID now (fault injection; local driver only).",
    ),
    "report": (
        "controller.cli.bags:report",
        "Where the money went: VM-hours, cost, on-demand cost, savings, idle and spare time, "
        "preemptions, hours lost and spent checkpointing, per VM type (and per bag).",
    ),
    "accounts": (
        "controller.cli.accounts:accounts",
        "CPU-hour accounts: create, credit, balances and ledger (docs/design.md#ledger).",
    ),
    "bags": ("controller.cli.events:bags", "Change a bag: its budget (bags set BAG --budget USD)."),
    "events": (
        "controller.cli.events:events",
        "Events (finished, failed, budget_reached, ...) and their webhook deliveries; "
        "--follow waits for more.",
    ),
    "simulate": (
        "controller.cli.offline:simulate",
        "Run SPEC_FILE on a virtual clock with the real scheduler and print the summary.",
    ),
    "fit": (
        "controller.cli.offline:fit_command",
        "Fit the bathtub, exponential, Weibull and Gompertz-Makeham models to VM lifetimes.",
    ),
    "checkpoint-plan": (
        "controller.cli.offline:checkpoint_plan_command",
        "When a job should checkpoint (the optimal schedule of docs/design.md#checkpoints), "
        "and the expected overhead of each policy, under a VM type's preemption model.",
    ),
    "split-cost": (
        "controller.cli.offline:split_cost_command",
        "Split a VM's cost among the jobs that shared it (docs/design.md#cost-reports).",
    ),
    "prepaid": (
        "controller.cli.prepaid:prepaid_command",
        "How many cores to prepay (reserve) for a term rather than buy on demand, per core "
        "type, from a usage history (docs/design.md#cost-reports).",
    ),
    "index": (
        "controller.cli.hopping:index_command",
        "The cloud index of a spot price TRACE (CSV: region,az,instance_type,product, "
        "timestamp_utc,spot_price_usd_hr,ondemand_price_usd_hr) and how much less volatile "
        "it is than the prices it averages.",
    ),
    "simulate-hopping": (
        "controller.cli.hopping:simulate_hopping_command",
        "Replay a spot price TRACE with a job under hopping policies: cost (and cost "
        "normalised to the cheapest fitting on-demand VM), availability, migrations and "
        "revocations.",
    ),
    "slurm": (
        "controller.slurm.cli:slurm_group",
        "Set a head node's Slurm up for spotbag (executor slurm).",
    ),
    "data": (
        "controller.cli.data:data_group",
        "The reference data shipped with spotbag (VM lifetimes, a spot price trace, an SWF "
        "trace); its README says what each file is, its source and licence.",
    ),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first asked for (click docs,
    "Advanced Groups and Context: Lazily Loading Subcommands"), and whose help lists them
    from their static one-line helps, importing none."""

    def __init__(
        self, *args, lazy_subcommands: dict[str, tuple[str, str]] | None = None, **kwargs
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_subcommands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own command list (each help cut to the terminal's width as click cuts
        it), from the static helps."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            command = self._stand_in(name) or self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _stand_in(self, cmd_name: str) -> click.Command | None:
        """A command with only the static help of `cmd_name`, for the list."""
        if cmd_name not in self.lazy_subcommands:
            return None
        return click.Command(cmd_name, help=self.lazy_subcommands[cmd_name][1])

    def _load(self, cmd_name: str) -> click.Command:
        module_name, attribute = self.lazy_subcommands[cmd_name][0].split(":")
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
