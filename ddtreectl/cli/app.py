"""The Typer application object and its global options. Command modules register on `app`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    name="ddtreectl",
    help="Operate multi-GPU DDTree inference hosts: status, deploy, units, restore, GPU gates.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


@dataclass
class GlobalOptions:
    inventory: Optional[Path] = None
    debug: bool = False


OPTIONS = GlobalOptions()


@app.callback()
def _global(
    inventory: Optional[Path] = typer.Option(
        None,
        "--inventory",
        "-i",
        help="Inventory file (default: $DDTREECTL_INVENTORY, then ./hosts.yaml).",
        envvar="DDTREECTL_INVENTORY",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
) -> None:
    """Operate multi-GPU DDTree inference hosts: status, deploy, units, restore, GPU gates."""
    OPTIONS.inventory = inventory
    OPTIONS.debug = debug
