"""`ddtreectl render HOST [--diff]`: the units ddtreectl would install, and drift against the host."""

from __future__ import annotations

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.errors import InventoryError, UsageError


@app.command("render")
def render_command(
    host: str = typer.Argument(..., metavar="HOST", help="Host name from the inventory."),
    diff: bool = typer.Option(
        False, "--diff", help="Connect and compare with what is installed: hand edits, drop-ins, NeedDaemonReload."
    ),
    json_out: bool = typer.Option(False, "--json", help="With --diff: machine-readable drift list (without "
                                  "--diff: a usage error, exit 2)."),
) -> None:
    """Print the systemd unit (and server --config) rendered for HOST; with --diff, show drift.

    Secrets live only in the host's 0600 EnvironmentFile and never appear here.

    Exit codes: 0 printed (with --diff: compared, drift or not); 3 inventory invalid, unknown host,
    no service profile or a template error; 4 (--diff) unreachable or host key refused; 2 --json
    without --diff.
    """
    from ddtreectl.operations.units import drift, read_installed
    from ddtreectl.render.units import render_service
    from ddtreectl.transport import connect
    from ddtreectl.ui import units_view

    if json_out:
        from ddtreectl.ui import json_doc

        # Also without --diff: the usage error below is then a render-diff document, as every
        # refusal ddtreectl itself makes under --json (README "JSON output").
        json_doc.expect(units_view.DRIFT_SCHEMA, fan_out=False, host=host)
    if json_out and not diff:
        # It used to print the unit text anyway, exit 0: a script that asked for JSON got a unit file.
        raise UsageError("--json goes with --diff (the drift list); the rendered files are printed as text",
                         hint=f"ddtreectl render {host} --diff --json, or ddtreectl render {host} for the files")
    inventory = load_inventory()
    target = inventory.host(host)
    rendered = render_service(inventory, target)
    if rendered is None:
        raise InventoryError(
            "runs no service profile; nothing to render",
            hint=f"set hosts.{host}.service in {inventory.path.name}",
            host=host,
        )
    if not diff:
        units_view.show_rendered(rendered)
        return
    with connect(target, inventory) as transport:
        found = drift(rendered, read_installed(transport, rendered))
    if json_out:
        json_doc.emit(units_view.drift_json(host, found))
    else:
        units_view.show_drift(host, found)
