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
    # Plain Click help: Typer's Rich help formatter imports rich.markdown, rich.traceback and
    # Pygments (~90 ms, half of `ddtreectl --help`) to draw boxes around the same text.
    rich_markup_mode=None,
    epilog="Exit codes: 0 ok, 1 internal, 2 usage, 3 inventory invalid, 4 connection or host key refused, "
           "5 remote command failed, 6 some hosts failed (others did not, or they failed differently; every host "
           "failing the same way exits with that code), 7 GPUs busy or unknown, 8 lock held, 130 interrupted; "
           "killed by SIGPIPE (shell: 141), silently, when the reader of the output has gone (`| head -1`).",
)


@dataclass
class GlobalOptions:
    inventory: Optional[Path] = None
    inventory_from_env: bool = False  # it came from $DDTREECTL_INVENTORY, not -i (named in errors)
    debug: bool = False


OPTIONS = GlobalOptions()


def _print_version(value: bool) -> None:
    """--version: what a bug report or a fleet comparison starts with (it was "No such option")."""
    if not value:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        typer.echo(f"ddtreectl {version('ddtreectl')}")
    except PackageNotFoundError:  # run from a checkout that was never installed
        typer.echo("ddtreectl (not installed: no package metadata; `python3 -m pip install .`)")
    raise typer.Exit()


@app.callback()
def _global(
    ctx: typer.Context,
    inventory: Optional[Path] = typer.Option(
        None,
        "--inventory",
        "-i",
        help="Inventory file (default: $DDTREECTL_INVENTORY, then ./hosts.yaml).",
        envvar="DDTREECTL_INVENTORY",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    _version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                  help="Print ddtreectl's version and exit."),
) -> None:
    """Operate multi-GPU DDTree inference hosts: status, deploy, units, restore, GPU gates."""
    OPTIONS.inventory = inventory
    source = ctx.get_parameter_source("inventory")
    OPTIONS.inventory_from_env = inventory is not None and source is not None and source.name == "ENVIRONMENT"
    OPTIONS.debug = debug
    if debug:
        # ddtreectl's own debug notes (e.g. why an SSH connection was not reused) on stderr;
        # Paramiko's wire-level chatter stays off.
        import logging

        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("debug: %(message)s"))
        logger = logging.getLogger("ddtreectl")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
