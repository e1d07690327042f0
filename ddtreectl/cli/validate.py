"""`ddtreectl validate`: check the inventory file without contacting any host."""

from __future__ import annotations

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.errors import InventoryError


@app.command()
def validate() -> None:
    """Check the inventory (every key and value, as every command does) and contact no host.

    Also fails on what the other commands accept with a warning because it is wrong in a shared
    file: a scoped IPv6 address (`fe80::1%eth0`; its zone names an interface of the machine it was
    typed on), which `set-ip` never writes. Each problem names the file, line and key path.
    Every host's unit and server config are rendered from the templates, as `render HOST` does
    (locally): a missing template or an undefined template variable fails here, not at deploy.
    An SSH host's `identity_file` that does not exist on this machine, or is not a readable file,
    is a warning naming file, line and host (it fails every connect to that host as "login failed"),
    not a failure: the key belongs to the machine running the command, not to the shared file.

    Exit codes: 0 valid; 3 invalid, or valid with warnings (listed on stderr).
    """
    inventory = load_inventory()  # raises on errors; prints the warnings
    if inventory.warnings:
        count = len(inventory.warnings)
        raise InventoryError(f"{inventory.path}: {count} warning{'s' if count > 1 else ''} above: "
                             "the file loads, but is not right for a shared inventory",
                             hint="fix each line named above (`ddtreectl set-ip HOST ADDRESS` rewrites an address)")
    counts = (f"{len(inventory.hosts)} host{'s' if len(inventory.hosts) != 1 else ''}, "
              f"{len(inventory.groups)} group{'s' if len(inventory.groups) != 1 else ''}, "
              f"{len(inventory.services)} service profile{'s' if len(inventory.services) != 1 else ''}")
    from ddtreectl.render.units import render_service

    for host in inventory.hosts.values():
        # Local, as `render HOST` is: a template name that is mistyped or missing beside the inventory,
        # or a variable a template needs and no profile gives, passed validate and failed at deploy.
        render_service(inventory, host)
    from ddtreectl.cli.common import print_warnings

    print_warnings(inventory.machine_warnings)
    keys = len(inventory.machine_warnings)
    typer.echo(f"{inventory.path}: valid ({counts})"
               + (f"; {keys} identity file warning{'s' if keys > 1 else ''} above" if keys else ""))
