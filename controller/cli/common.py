"""What the command modules share: the consoles, the exit codes, and turning a
refused or failed request into a message and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import click

from controller.cli.client import Client, ClientError

if TYPE_CHECKING:
    from rich.console import Console

    console: Console
    err_console: Console


def __getattr__(name: str) -> Any:
    """`console` and `err_console`, rich Consoles made when a command module first asks for
    them: a command that prints plain text (`spotbag status BAG`) does not import
    rich.console (20 ms of a 100 ms command)."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    made = globals()
    # Piped output (files, CI logs) gets wide lines rather than truncated tables.
    made["console"] = Console() if sys.stdout.isatty() else Console(width=200)
    made["err_console"] = Console(stderr=True)
    return made[name]


EXIT_UNREACHABLE = 1
EXIT_REFUSED = 2
EXIT_BAG_FAILED = 3
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG
TERMINAL_BAG_STATES = ("succeeded", "failed", "cancelled")


def fail(error: ClientError) -> NoReturn:
    """Print what the API said (each field problem on its line) and exit 1 when the
    daemon failed or could not be reached, 2 when it refused the request."""
    say_error(error.message)
    for problem in (error.detail or {}).get("errors", [])[1:]:
        click.echo(f"       {problem['field']}: {problem['message']}", err=True)
    sys.exit(EXIT_UNREACHABLE if error.status in (0, 500) else EXIT_REFUSED)


def refuse(message: str) -> NoReturn:
    """An input the command cannot use: the message, then exit 2."""
    say_error(message)
    sys.exit(EXIT_REFUSED)


def say_error(message: str) -> None:
    """`error: message` on stderr, "error:" in red on a terminal (click drops the colour
    elsewhere), without rich."""
    click.echo(f"{click.style('error:', fg='red')} {message}", err=True)


def client_of(ctx: click.Context) -> Client:
    return ctx.obj["client"]


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs), a client request; an error answer ends the command."""
    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        fail(exc)


def load_spec_file(path: str) -> Any:
    """A bag spec from a YAML or JSON file ('-' reads standard input); exit 2 when unusable."""
    from controller.cli.specfile import SpecFileError
    from controller.cli.specfile import load_spec_file as load

    try:
        return load(path, sys.stdin.read() if path == "-" else None)
    except SpecFileError as exc:
        refuse(str(exc))
