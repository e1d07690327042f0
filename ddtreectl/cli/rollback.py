"""`ddtreectl rollback H... [--to ID]`: switch `current` back to an earlier good release."""

from __future__ import annotations

import threading
from typing import List, Optional

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.cli.deploy import exit_code_of, fan_out, resolve_targets
from ddtreectl.inventory.models import Host


@app.command("rollback")
def rollback_command(
    targets: Optional[List[str]] = typer.Argument(None, metavar="[TARGET]...", help="Hosts, groups or `all` (as "
                                                  "for deploy; --host/--group work too)."),
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help="A host to roll back (repeatable)."),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help="A group to roll back (repeatable)."),
    to: Optional[str] = typer.Option(None, "--to", metavar="ID", help="The release to switch to (default: the "
                                     "previous one)."),
    restart: bool = typer.Option(False, "--restart", help="Restart the service on that release if it runs or "
                                 "crash-loops, then verify it through restore-service's health gate."),
    lock_wait: float = typer.Option(0.0, "--lock-wait", metavar="SECONDS", help="Wait for another deploy's lock."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable results on stdout."),
) -> None:
    """Switch `current` back to the previous good release (or --to ID, which must have a good build
    stamp), atomically, under the deploy lock, with an audit line. Nothing is rebuilt. A host another
    operator holds for development (`mode HOST dev`) is refused (exit 8, naming the holder).

    --restart restarts the service if it runs or crash-loops between Restart= attempts (a stopped unit
    is left stopped: restore-service starts it), then gates it like restore-service: unit active,
    port open, /health, readiness, model listed, /server_info; a failed phase is exit 5 with this
    start's journal lines; Ctrl-C during the gate stops waiting and says the state (exit 130). Without
    --restart a running service keeps its release: "restart pending" says which (--json: still_running).

    Exit codes: 0 switched (and with --restart, verified healthy); 5 no earlier good release, or
    switched but the --restart or its health gate failed; 2 --to ID does not exist on the host, has
    no good build stamp or is already current (the hint lists the good releases); 8 deploy lock held,
    or held for development by someone else;
    4 unreachable; 6 some hosts failed; 3 inventory invalid or unknown host/group.
    """
    from ddtreectl.operations.plan import rollback_host
    from ddtreectl.transport import connect
    from ddtreectl.ui import deploy_view, units_view

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect("ddtreectl.rollback/1", fan_out=True)
    inventory = load_inventory()
    hosts = resolve_targets(inventory, targets, host, group, verb="roll back")

    def one(h: Host, cancel: threading.Event) -> object:
        with connect(h, inventory) as transport:
            return rollback_host(transport, inventory, h, to=to, lock_wait_s=lock_wait, restart=restart, cancel=cancel,
                                 on_event=(lambda event: None) if json_out else units_view.phase_printer)

    # The health gate after --restart may take as long as the slowest profile's total timeout.
    gate_s = max((s.health.total_timeout for h in hosts if (s := inventory.service_of(h)) is not None),
                 default=0.0) if restart else 0.0
    outcome = fan_out(hosts, one, 600.0 + lock_wait + gate_s)
    errors = [(r.host.name, r.error) for r in outcome.failed if r.error is not None]
    code = exit_code_of([e for _, e in errors], len(hosts))
    deploy_view.show_rollbacks([r.value for r in outcome.ok], errors, as_json=json_out,  # type: ignore[misc]
                               targets=[h.name for h in hosts], exit_code=code)
    deploy_view.show_errors(errors)
    if code:
        raise typer.Exit(code)
