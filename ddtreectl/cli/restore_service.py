"""`ddtreectl restore-service [TARGET...]`: bring production back, verified healthy."""

from __future__ import annotations

from typing import Any, List, Optional

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.errors import DdtreeError, ExitCode, UsageError, fan_out_exit_code


@app.command("restore-service")
def restore_service_command(
    targets: Optional[List[str]] = typer.Argument(
        None, metavar="[TARGET]...", help="Hosts, groups or `all` (default: every host whose role is prod)."
    ),
    no_enable: bool = typer.Option(False, "--no-enable", help="Start it now but do not enable it at boot."),
    force: bool = typer.Option(
        False, "--force", help="Start despite drifted units or GPUs held by other processes (recorded)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable results."),
) -> None:
    """Bring the production service back, verified healthy.

    Preflight (release built, unit installed and not drifted, GPUs free of foreign processes),
    enable at boot, start (each bounded by the host's command_timeout), then gate phase by phase: unit active, port open, /health, readiness,
    model listed in /v1/models, /server_info matches the rendered config. HTTP checks run through the
    SSH connection. A multi-node service starts every rank and gates on rank 0.

    A host held for development (`mode HOST dev`) is refused, --force or not: `mode HOST prod` ends
    the lease and restores through the same gate. So is a unit of an older name (the profile's
    unit_name changed) that still runs: the two would fight for the port and GPUs (`deploy HOST
    --restart` replaces it); a stopped one is disabled and deleted first, audited, as deploy does
    (--json `units_removed`, kept in a host's entry, with `enabled` and `warnings`, however the
    restore ends after it: a failed enable or start, a start that timed out with its state unreadable
    or a dropped connection, where `started` is null: sent, not confirmed).

    Ctrl-C (SIGTERM, SIGHUP) during the gate stops waiting at once and exits 130 saying the state:
    the unit started (enabled or not), its health unknown; `status HOST` says whether it serves yet,
    `restore-service HOST` verifies it. Before the start, nothing is started.

    Exit codes: 0 healthy, 5 a phase failed (phase, time and journal shown) or a refusal (no built
    release, unit missing or drifted, an old unit running), 7 GPUs held by other
    processes, 8 held for development, 6 some hosts failed while others succeeded, 4 unreachable, 3 inventory invalid, unknown
    target or a host without a service profile, 2 no target and no `role: prod` host, 130 interrupted.
    """
    import threading

    from ddtreectl.cli.deploy import fan_out
    from ddtreectl.inventory.models import Host
    from ddtreectl.operations.restore import RestoreOptions, RestoreResult, restore_host
    from ddtreectl.transport import connect
    from ddtreectl.ui import units_view
    from rich.markup import escape

    from ddtreectl.ui.console import stderr

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect(units_view.RESTORE_SCHEMA, fan_out=True)
    inventory = load_inventory()
    hosts = inventory.resolve(targets) if targets else [h for h in inventory.hosts.values() if h.role == "prod"]
    if not hosts:
        raise UsageError("no target: the inventory has no host with role prod",
                                 hint="name the hosts to restore")
    options = RestoreOptions(enable=not no_enable, force=force)

    def unit_of(host: Host) -> str | None:
        service = inventory.service_of(host)
        return service.unit if service else None

    # A multi-node service is restored as a whole: other ranks start first, rank 0 is gated.
    names = {h.name for h in hosts}
    for host in list(hosts):
        service = inventory.service_of(host)
        if service is not None and service.nodes:
            names.update(service.nodes)
    ordered = [inventory.hosts[n] for n in inventory.hosts if n in names]

    def is_follower(host: Host) -> bool:
        service = inventory.service_of(host)
        return service is not None and bool(service.nodes) and service.nodes[0] != host.name

    # What each host's restore changed so far: kept when an error ends it half way (a start timed out
    # with its state unreadable, the connection dropped), so its entry still says what was done.
    done: dict[str, RestoreResult] = {}

    def restore(host: Host, gate: bool, cancel: threading.Event) -> RestoreResult:
        record = done[host.name] = RestoreResult(host=host.name, unit=unit_of(host) or "")
        with connect(host, inventory) as transport:
            return restore_host(transport, inventory, host, options, gate=gate, result=record, cancel=cancel,
                                on_event=(lambda event: None) if json_out else units_view.phase_printer)

    deadline = max((inventory.service_of(h).health.total_timeout for h in ordered  # type: ignore[union-attr]
                    if inventory.service_of(h)), default=3600.0) + 120
    # Ctrl-C: the gate stops waiting, and the interrupt says per host the state it left (as deploy's).
    def finished(value: RestoreResult) -> str:
        return "finished before the interrupt: " + (f"{value.unit} verified healthy" if value.ok else
                                                    f"{value.unit} failed in phase {value.failure.phase!r}"
                                                    if value.failure else value.unit)

    followers = fan_out([h for h in ordered if is_follower(h)], lambda h, cancel: restore(h, False, cancel),
                        deadline, finished=finished)
    leaders = fan_out([h for h in ordered if not is_follower(h)], lambda h, cancel: restore(h, True, cancel),
                      deadline, finished=finished)
    outcomes = list(followers.results) + list(leaders.results)
    results = [r.value for r in outcomes if r.ok and r.value is not None]
    errors = [r for r in outcomes if not r.ok]

    code = _exit_code(errors, [r for r in results if not r.ok], len(outcomes))
    units_view.show_restore(results, as_json=json_out, exit_code=code, targets=[h.name for h in ordered],
                            errors=[(r.host.name, unit_of(r.host), r.error) for r in errors if r.error is not None],
                            done=done)
    for r in errors:
        hint = getattr(r.error, "hint", None)
        # A DdtreeError already names its host; anything else gets the host prefixed here.
        named = isinstance(r.error, DdtreeError) and r.error.host
        message = escape(str(r.error) if named else f"{r.host.name}: {r.error}")
        stderr().print(f"[red]error: {message}[/red]" + (f"\nhint: {escape(hint)}" if hint else ""))
    if code:
        raise typer.Exit(code)


def _exit_code(errors: list[Any], failed_gates: list[Any], total: int) -> int:
    """The fan-out rule (errors.fan_out_exit_code); a failed gate is 5."""
    return fan_out_exit_code([int(getattr(r.error, "exit_code", ExitCode.INTERNAL)) for r in errors]
                             + [int(ExitCode.REMOTE)] * len(failed_gates), total)
