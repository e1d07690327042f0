"""`ddtreectl status [TARGET...]`: what state is each host in, answered in one round trip per host."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import typer

from ddtreectl.cli.app import OPTIONS, app
from ddtreectl.errors import ConnectError, DdtreeError, ExitCode, PartialFailureError, RemoteCommandError

DEFAULT_DEADLINE_S = 20.0


def complete_targets(ctx: typer.Context, incomplete: str) -> list[str]:
    """Host and group names from the inventory for shell completion. Never raises: a broken or
    missing inventory completes nothing rather than printing a traceback into the shell."""
    try:
        from ddtreectl.inventory.loader import load

        root = ctx.find_root()
        given = root.params.get("inventory") if root is not None else None
        env = os.environ.get("DDTREECTL_INVENTORY")
        path = Path(given) if given else Path(env) if env else Path("hosts.yaml")
        inventory = load(path)
        names = ["all", *inventory.hosts, *inventory.groups]
    except Exception:  # noqa: BLE001 - completion must never crash the user's shell
        return []
    return [n for n in dict.fromkeys(names) if n.startswith(incomplete)]


@app.command()
def status(
    targets: Optional[list[str]] = typer.Argument(
        None, metavar="[TARGET]...", autocompletion=complete_targets,
        help="Host names, group names or `all` (default: every host in the inventory).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (schema below) instead of a table."),
    timeout: float = typer.Option(
        DEFAULT_DEADLINE_S, "--timeout", "--deadline", min=1.0,
        help="Global deadline in seconds for all hosts together; hosts still silent then are "
             "reported as 'no answer'. Each connect also has the host's connect_timeout.",
    ),
    no_reuse: bool = typer.Option(
        False, "--no-reuse",
        help="Open a fresh SSH connection to every host instead of reusing the OpenSSH master "
             "an earlier command left (kept 60 s after last use). Same as DDTREECTL_SSH_REUSE=0.",
    ),
) -> None:
    """Show each host's reachability, GPUs, service state and release.

    Hosts are probed in parallel: one SSH connection and one probe round
    trip per host. An unreachable host costs its connect timeout once and
    never delays the others. The service state is said in words: running,
    starting, restarting after a failure, failed (exit status, restart
    count), stopped but enabled, stopped and disabled (will not start at
    boot), masked, not installed, or unknown (and why). A running unit is
    asked whether it serves yet (port open, then GET /health, 5 s): right
    after a start it says "not serving yet" (port closed or 503 while the
    model loads) until /health answers 200 ("serving"). On a `role: prod`
    host not held for development, a service that is not running is also
    a warning that names the command bringing it back.

    Where the terminal is too narrow for the table to keep each state
    readable (80 columns, or a pipe), one block per host is printed
    instead: name, address, reach, then labelled GPUs, service, release
    and warnings lines. --json is the same either way.

    SSH connections are reused: an OpenSSH master stays up for 60 s after
    its last use (ControlPersist; sockets in $DDTREECTL_SSH_CONTROL_DIR,
    else $XDG_RUNTIME_DIR/ddtreectl/cm, else ~/.cache/ddtreectl/cm, 0700),
    so the next status skips the connection set-up. The pinned host key
    is still checked on every run (a changed key closes the master and is
    refused as on a new connection). --no-reuse, DDTREECTL_SSH_REUSE=0 or
    `ssh_reuse: false` in the inventory (per host or in defaults:) opens a
    fresh connection per host instead. Jump hosts are not reused.

    A host that answers but refuses the login (user, identity file) reads
    "login failed" (--json: outcome unreachable; its error says why).

    Exit codes: 0 every targeted host answered; 6 some answered and some
    did not (unreachable, login failed, no answer by the deadline, probe
    failed); when none answered, the code their failures share, as a
    single-host command exits: 4 unreachable, login failed or no answer
    by the deadline, 5 the
    probe failed (6 when they differ); 4 a host's key or machine-id is
    not the one pinned for its name (outranks the rest); 3 the inventory
    is invalid or a target is unknown.

    --json schema (stable; fields are only added within a version):

    """
    from ddtreectl.cli.common import inventory_path, load_inventory
    from ddtreectl.operations.status import gather_status

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect("ddtreectl.status/1", fan_out=True)
    inventory = load_inventory()
    hosts = inventory.resolve(targets or [])
    report = gather_status(inventory, hosts, deadline_s=timeout, reuse=not no_reuse)
    if json_out:
        from ddtreectl.ui.status_json import report_to_json

        json_doc.emit(report_to_json(report, inventory_path()))
    else:
        from ddtreectl.ui.console import stdout_plain
        from ddtreectl.ui.status_table import render_status

        render_status(report, stdout_plain())
    if OPTIONS.debug:
        for host_status in report.hosts:
            if host_status.exception is not None:
                traceback.print_exception(host_status.exception, file=sys.stderr)
    code = report.exit_code()
    if code == ExitCode.OK:
        return
    problems = [h for h in report.hosts if not h.answered]
    listing = ", ".join(f"{h.host.name} ({h.reach if h.outcome == 'unreachable' else h.outcome})" for h in problems)
    refused = [h for h in problems if h.outcome == "refused"]
    if refused:
        # A host never trusted has nothing pinned to differ from: it needs `trust`, not suspicion.
        new = [h.host.name for h in refused if h.host.host_key is None]
        changed = [h.host.name for h in refused if h.host.host_key is not None]
        first_contact = f"no pinned host key yet for {', '.join(new)} (never trusted)" if new else ""
        if not changed:
            raise ConnectError(first_contact, hint="check the fingerprint above out of band, then "
                               + "; ".join(f"`ddtreectl trust {name}`" for name in new))
        raise ConnectError(
            f"refused to trust {', '.join(changed)}: the key or machine-id is not the one pinned for "
            "the host's name" + (f"; {first_contact}" if first_contact else ""),
            hint="the reasons and fingerprints are above (JSON: hosts[].error); "
                 "do not re-trust a host before you know why it changed")
    if code == ExitCode.INTERNAL:
        raise DdtreeError(f"status failed unexpectedly on {listing}",
                          hint="run with --debug for the traceback and report it as a bug")
    error = {ExitCode.CONNECTION: ConnectError, ExitCode.REMOTE: RemoteCommandError}.get(
        ExitCode(code), PartialFailureError)
    raise error(f"{len(problems)} of {len(report.hosts)} hosts did not answer: {listing}",
                hint="the table/JSON above gives each host's reason")


def _append_schema_to_help() -> None:
    """Put the JSON schema into --help verbatim (`\\b` keeps Click from re-wrapping it)."""
    from ddtreectl.ui.status_schema import STATUS_JSON_SCHEMA

    assert status.__doc__ is not None
    status.__doc__ += "\b\n" + "\n".join("    " + line for line in STATUS_JSON_SCHEMA.splitlines())


_append_schema_to_help()
