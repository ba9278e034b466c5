"""`spotbag data list|path`: where the reference data shipped with spotbag is
(controller/traces/reference_data.py), so that the examples run on any install:

    spotbag fit "$(spotbag data path lifetimes)" --by machine_type
"""

from __future__ import annotations

import click

from controller.traces.reference_data import DATASETS, REFERENCE_DIR


@click.group("data")
def data_group() -> None:
    """The reference data shipped with spotbag (VM lifetimes, a spot price trace, an SWF
    trace); its README says what each file is, its source and licence."""


@data_group.command("list")
def data_list() -> None:
    """Each shipped dataset: its name, its path and what it is."""
    for dataset in DATASETS.values():
        click.echo(f"{dataset.name:12s} {dataset.path}")
        click.echo(f"{'':12s} {dataset.description}")
    click.echo(f"{'README':12s} {REFERENCE_DIR / 'README.md'}")


@data_group.command("path")
@click.argument("name", required=False, type=click.Choice(sorted(DATASETS)))
def data_path(name: str | None) -> None:
    """The path of dataset NAME; without NAME, the folder that holds them all."""
    click.echo(str(DATASETS[name].path if name else REFERENCE_DIR))
