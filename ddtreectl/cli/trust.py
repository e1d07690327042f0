"""`ddtreectl trust HOST`: show a host's key fingerprint, ask, and pin it under the host's name."""

from __future__ import annotations

import sys

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.errors import UsageError


@app.command()
def trust(
    host: str = typer.Argument(..., metavar="HOST", help="Host name from the inventory."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask (you verified the fingerprint)."),
    replace: bool = typer.Option(
        False, "--replace", help="Replace a different key, machine-id or GPU UUIDs already recorded "
        "(host reinstalled, GPUs swapped)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable result on stdout (the prompt goes "
                                  "to stderr)."),
) -> None:
    """Pin HOST's SSH host key (after showing its fingerprint) and record its machine-id and GPUs.

    Nothing but the SSH key exchange happens before you agree: no login, no command. Compare the
    fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on the host itself.

    GPU UUIDs that differ from the recorded ones (a GPU swap, or another machine with a cloned
    image) are refused like a different machine-id: nothing is recorded without --replace, which
    then says what it replaced (text: a REPLACED line on stderr; --json: `replaced`).

    Exit codes: 0 pinned (or already trusted); 4 declined, unreachable, or a different key,
    machine-id or GPU UUIDs are recorded (see --replace); 2 no answer (stdin not a terminal: use
    --yes) or a `transport: local` host; 3 inventory invalid or unknown host.
    """
    from ddtreectl.operations.trust import TrustOffer, trust_host
    from ddtreectl.ui import trust_view

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect(trust_view.SCHEMA, fan_out=False, host=host)
    inventory = load_inventory()

    def confirm(offer: TrustOffer) -> bool:
        typer.echo(f"{offer.host.name} ({offer.address}) presents {offer.presented.key_type} key", err=json_out)
        typer.echo(f"  fingerprint: {offer.presented.fingerprint}", err=json_out)
        if offer.pinned is not None:
            typer.echo(f"  REPLACING pinned {offer.pinned.key_type} key {offer.pinned.fingerprint}", err=json_out)
        if yes:
            return True
        try:
            return typer.confirm("Trust this key for " + offer.host.name + "?", default=False, err=json_out)
        except typer.Abort:
            if sys.stdin is not None and sys.stdin.isatty():
                raise  # Ctrl-C at the prompt: interrupted
            # end of input without a terminal (a script, cron, CI): nobody answered, nothing was pinned
            typer.echo("", err=json_out)  # end the prompt's line
            raise UsageError(f"no answer to the trust prompt for {offer.host.name} (stdin is not a terminal); "
                             "nothing was recorded",
                             hint=f"compare the fingerprint above out of band, then `ddtreectl trust "
                                  f"{offer.host.name}{' --replace' if replace else ''} --yes`") from None

    outcome = trust_host(inventory, host, confirm=confirm, replace=replace)
    trust_view.show(outcome, inventory.path, as_json=json_out)
