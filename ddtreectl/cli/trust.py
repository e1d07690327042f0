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
        False, "--replace", help="Replace a different key already pinned (host reinstalled)."
    ),
) -> None:
    """Pin HOST's SSH host key (after showing its fingerprint) and record its machine-id and GPUs.

    Nothing but the SSH key exchange happens before you agree: no login, no command. Compare the
    fingerprint with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on the host itself.

    Exit codes: 0 pinned (or already trusted); 4 declined, unreachable, or a different key or
    machine-id is pinned (see --replace); 2 no answer (stdin not a terminal: use --yes) or a
    `transport: local` host; 3 inventory invalid or unknown host.
    """
    from ddtreectl.operations.trust import TrustOffer, trust_host

    inventory = load_inventory()

    def confirm(offer: TrustOffer) -> bool:
        typer.echo(f"{offer.host.name} ({offer.address}) presents {offer.presented.key_type} key")
        typer.echo(f"  fingerprint: {offer.presented.fingerprint}")
        if offer.pinned is not None:
            typer.echo(f"  REPLACING pinned {offer.pinned.key_type} key {offer.pinned.fingerprint}")
        if yes:
            return True
        try:
            return typer.confirm("Trust this key for " + offer.host.name + "?", default=False)
        except typer.Abort:
            if sys.stdin is not None and sys.stdin.isatty():
                raise  # Ctrl-C at the prompt: interrupted
            # end of input without a terminal (a script, cron, CI): nobody answered, nothing was pinned
            typer.echo("")  # end the prompt's line
            raise UsageError(f"no answer to the trust prompt for {offer.host.name} (stdin is not a terminal); "
                             "nothing was recorded",
                             hint=f"compare the fingerprint above out of band, then `ddtreectl trust "
                                  f"{offer.host.name}{' --replace' if replace else ''} --yes`") from None

    outcome = trust_host(inventory, host, confirm=confirm, replace=replace)
    for warning in outcome.warnings:
        typer.echo(f"warning: {host}: {warning}", err=True)
    gpus = f"{len(outcome.gpu_uuids)} GPU UUID(s)" if outcome.gpu_uuids else "no GPUs"
    if outcome.changed:
        typer.echo(f"{host}: pinned {outcome.key.describe()}, machine-id {outcome.machine_id}, "
                   f"{gpus} -> {inventory.path}")
    else:
        typer.echo(f"{host}: already trusted ({outcome.key.describe()}); inventory unchanged")
