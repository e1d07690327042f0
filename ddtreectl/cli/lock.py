"""`ddtreectl lock status|release HOST`: inspect or free a host's deploy lock."""

from __future__ import annotations

import time

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory

# The locks ddtreectl takes. Any other name used to be accepted (a valid path component) and read as
# "free": `lock status HOST --name mdoe` said "mdoe lock free", exit 0, while the mode lock was held.
LOCKS = {"deploy": "deploy and rollback", "mode": "mode switches"}


def _known_lock(name: str) -> str:
    """`name` if ddtreectl takes a lock of that name, else UsageError (exit 2) with the closest one."""
    from ddtreectl.errors import UsageError
    from ddtreectl.inventory.models import did_you_mean
    from ddtreectl.operations.remote_lock import check_name

    check_name(name)  # the path-safety message first: it says why such a name can never be a lock
    if name not in LOCKS:
        raise UsageError(f"{name!r} is not a lock name ddtreectl takes{did_you_mean(name, LOCKS)}",
                         hint="; ".join(f"--name {k}: the lock of {v}" for k, v in LOCKS.items()))
    return name


lock_app = typer.Typer(help="Show or release a host's lock (deploy, or mode with --name mode).",
                       no_args_is_help=True)
app.add_typer(lock_app, name="lock")


@lock_app.command("status")
def lock_status_command(
    host: str = typer.Argument(..., metavar="HOST", help="The host."),
    name: str = typer.Option("deploy", "--name", help="Which lock: deploy or mode."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable result on stdout."),
) -> None:
    """Who holds the lock, why and since when; whether an automatic lock has expired.

    --json prints one `ddtreectl.lock-status/1` document (README, "JSON output"): `host`, `ok`, `lock`,
    `held`, and `holder` (null when free, else owner, reason, kind, since as Unix seconds and
    since_utc, ttl_s, expired, description); a held lock is exit 8 with `error` null, a failure has
    `error` set.

    Exit codes: 0 free; 8 held; 4 unreachable; 2 not a lock name (deploy, mode); 3 inventory invalid or
    unknown host.
    """
    from ddtreectl.operations import remote_lock
    from ddtreectl.transport import connect
    from ddtreectl.ui import json_doc
    from ddtreectl.ui.console import stdout
    from ddtreectl.ui.lock_view import lock_status_json

    if json_out:
        json_doc.expect("ddtreectl.lock-status/1", fan_out=False, host=host)
    name = _known_lock(name)
    inventory = load_inventory()
    target = inventory.host(host)
    with connect(target, inventory) as transport:
        holder = remote_lock.status(transport, target.remote_root, name)
    if json_out:
        json_doc.emit(lock_status_json(host, name, holder, int(time.time())))
        if holder is not None:
            raise typer.Exit(8)
        return
    if holder is None:
        stdout().print(f"{host}: {name} lock free")
        return
    stdout().print(f"{host}: {name} lock {holder.describe(int(time.time()))}", markup=False)
    raise typer.Exit(8)


@lock_app.command("release")
def lock_release_command(
    host: str = typer.Argument(..., metavar="HOST", help="The host."),
    name: str = typer.Option("deploy", "--name", help="Which lock: deploy or mode."),
    force: bool = typer.Option(False, "--force", help="Release a lock someone else holds (audited)."),
) -> None:
    """Release the lock (yours; someone else's only with --force, recorded in the host's audit log).

    Exit codes: 0 released (or was not held); 8 someone else holds it (see --force); 4 unreachable;
    2 not a lock name (deploy, mode); 3 inventory invalid or unknown host.
    """
    from ddtreectl.operations import remote_lock
    from ddtreectl.operations.audit import append_audit
    from ddtreectl.transport import connect
    from ddtreectl.ui.console import stdout

    name = _known_lock(name)
    name = _known_lock(name)
    inventory = load_inventory()
    target = inventory.host(host)
    with connect(target, inventory) as transport:
        holder = remote_lock.status(transport, target.remote_root, name)
        removed = remote_lock.release(transport, target.remote_root, name, force=force)
        if removed and holder is not None:
            append_audit(transport, target.remote_root, "lock-release", lock=name, holder=holder.owner,
                         forced=force)
    stdout().print(f"{host}: {name} lock " + ("released" if removed else "was not held"))
