"""The `spotbag` group's static command table (controller/cli/__init__.py COMMANDS): it
names every command with its own one-line help, and `spotbag --help` shows the list click
would show from the commands themselves, without importing any of them (issue 24)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from controller.cli import COMMANDS, cli
from tests.conftest import run_cli_recording_modules


def test_each_command_in_the_table_is_the_one_named_with_its_own_one_line_help():
    ctx = click.Context(cli)
    for name, (_, short_help) in COMMANDS.items():
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name, (name, command)
        assert command.get_short_help_str(limit=10**6) == short_help, name


@pytest.mark.parametrize("width", [80, 200])
def test_help_lists_what_click_would_list_from_the_commands(width, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(width))
    shown = CliRunner().invoke(cli, ["--help"], terminal_width=width)
    assert shown.exit_code == 0, shown.output
    # click's own list, made from the imported commands.
    ctx = click.Context(cli, terminal_width=width)
    formatter = ctx.make_formatter()
    click.Group.format_commands(cli, ctx, formatter)
    listed = formatter.getvalue()
    assert listed.startswith("Commands:\n") and "  status  " in listed
    assert shown.output.endswith(listed)


# What a command the user did not ask for would bring.
HEAVY = ("numpy", "scipy", "pydantic", "matplotlib", "yaml", "sqlite_utils", "aiohttp")


@pytest.mark.processes
def test_help_imports_click_and_no_command_module(tmp_path):
    done, imported = run_cli_recording_modules(tmp_path, "--help")
    assert done.returncode == 0 and "Commands:" in done.stdout, done.stderr
    assert "click" in imported
    assert not {m for m in imported if m.split(".")[0] in HEAVY or m == "rich.console"}
    ours = {m for m in imported if m.startswith("controller")}
    assert ours == {"controller", "controller.cli", "controller.errors"}, ours
