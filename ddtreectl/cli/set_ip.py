"""`ddtreectl set-ip HOST ADDRESS`: move a host to a new address, proven and swept."""

from __future__ import annotations

import sys

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory

# The one default of the stale-reference sweep's deadline: the operation takes it as a required
# argument, so registering this command imports nothing of the operation.
DEFAULT_SWEEP_DEADLINE_S = 30.0


@app.command("set-ip")
def set_ip(
    host: str = typer.Argument(..., metavar="HOST", help="Host name from the inventory."),
    address: str = typer.Argument(..., metavar="ADDRESS", help="The new IPv4/IPv6 address or DNS name."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the diff, check and sweep; write nothing."),
    no_verify: bool = typer.Option(
        False, "--no-verify",
        help="Skip the identity check: for a host that is still down, or a `local` host (never connected to).",
    ),
    force: bool = typer.Option(False, "--force", help="Allow an address another host already has."),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    timeout: float = typer.Option(
        DEFAULT_SWEEP_DEADLINE_S, "--timeout", min=5.0,
        help="Deadline in seconds for sweeping all hosts for the old address.",
    ),
) -> None:
    """Change HOST's address in the inventory, after proving the machine
    there is HOST.

    Only the address scalar changes (comments, quoting, order, anchors
    and line endings are kept); the write is atomic. First the machine
    at the NEW address must present the SSH key pinned for HOST's name,
    its recorded machine-id and GPU UUIDs (exit 4 otherwise, naming what
    differed; the file is untouched). Then the project's files and the
    units installed on every reachable inventory host are searched for
    the OLD address (file:line), hosts whose units need re-rendering are
    named, and an audit line is appended on HOST.

    A `transport: local` host is run on this machine and never connected
    to, so nothing can prove its new address: it is refused (exit 3)
    unless --no-verify records the address unverified.

    A scoped IPv6 address (fe80::1%eth0) is refused whatever the flags
    (exit 3): its zone names an interface of this machine, and the
    inventory is read on others; the hint gives the form to type.

    Exit codes: 0 done (or nothing to do); 3 bad address, a scoped IPv6
    address, unknown host, address taken (see --force), a local host
    without --no-verify, or inventory invalid; 4 new address unreachable or not this machine.
    """
    from ddtreectl.operations.set_ip import set_ip as run_set_ip
    from ddtreectl.ui.set_ip_view import render_text, to_json

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect("ddtreectl.set-ip/1", fan_out=False, host=host)
    inventory = load_inventory()
    result = run_set_ip(inventory, host, address, force=force, dry_run=dry_run,
                        verify=not no_verify, sweep_deadline_s=timeout)
    if json_out:
        json_doc.emit(to_json(result))
    else:
        sys.stdout.write(render_text(result) + "\n")
