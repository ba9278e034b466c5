"""What the command modules share: the consoles, the exit codes, and turning a
refused or failed request into a message and an exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click
from rich.console import Console

from controller.cli.client import Client, ClientError

# Piped output (files, CI logs) gets wide lines rather than truncated tables.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True)

EXIT_UNREACHABLE = 1
EXIT_REFUSED = 2
EXIT_BAG_FAILED = 3
EXIT_CONFIG = 78  # sysexits.h EX_CONFIG
TERMINAL_BAG_STATES = ("succeeded", "failed", "cancelled")


def fail(error: ClientError) -> NoReturn:
    """Print what the API said (each field problem on its line) and exit 1 when the
    daemon failed or could not be reached, 2 when it refused the request."""
    err_console.print(f"[red]error:[/red] {error.message}", highlight=False)
    for problem in (error.detail or {}).get("errors", [])[1:]:
        err_console.print(f"       {problem['field']}: {problem['message']}", highlight=False)
    sys.exit(EXIT_UNREACHABLE if error.status in (0, 500) else EXIT_REFUSED)


def refuse(message: str) -> NoReturn:
    """An input the command cannot use: the message, then exit 2."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    sys.exit(EXIT_REFUSED)


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
