"""`ddtreectl mode HOST [dev|prod]`: show or switch a host between production and development."""

from __future__ import annotations

import time
from typing import Optional

import typer

from ddtreectl.cli.app import app
from ddtreectl.errors import DdtreeError, UsageError


@app.command()
def mode(
    host_name: str = typer.Argument(..., metavar="HOST", help="The host to show or switch."),
    target: Optional[str] = typer.Argument(None, metavar="[dev|prod]", help="Switch to this mode."),
    reason: str = typer.Option("", "--reason", help="Why you take the host (required for dev)."),
    ttl: str = typer.Option("8h", "--ttl", help="How long the development lease lasts (90s, 30m, 8h, 1d)."),
    drain_timeout: float = typer.Option(300.0, "--drain-timeout", min=0.0,
                                        help="Seconds to wait for in-flight requests before stopping."),
    idle_timeout: float = typer.Option(120.0, "--idle-timeout", min=0.0,
                                       help="Seconds to wait for the GPUs to go idle after the stop."),
    force: bool = typer.Option(False, "--force", help="Override a refusal (recorded in the audit log)."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable result."),
) -> None:
    """Show the host's mode, or switch it.

    `mode HOST dev --reason "…" [--ttl 8h]`: drain the production service (wait until /metrics shows
    no request running or queued, up to --drain-timeout), disable and stop it, verify the GPUs went
    idle, then record who holds the host, why, since and until when (<remote_root>/state/mode.json).
    Where declared GPUs cannot be read at all (no nvidia-smi), or nvidia-smi lists another number
    of GPUs than the inventory's `gpus:` (gpus: 0 included), it refuses before changing anything;
    a host the inventory declares GPU-less (gpus: 0) needs no nvidia-smi. That check is one
    nvidia-smi query, said as a step (on a gpus: 0 host: that it has no GPUs, as declared).

    `mode HOST prod`: refuse while development processes hold GPUs (exit 7, naming them), then restore
    the service through the same preflight and health gate as `restore-service`, and clear the lease.
    A gate that fails after the start ends the lease too (the service is enabled and started: the
    host is production's); the error says so and names the next step. A refused preflight (as for
    restore-service, including a unit of an older name still running) starts nothing and keeps the
    lease; so does a failed `systemctl start` (the unit is disabled again; --json `restore` then says
    started false and which stopped units of an older name were removed before it). A
    `systemctl start` that runs past the host's command_timeout is judged by the unit's state after it:
    running, starting or with its job queued, the start took (gate, lease ended); else it failed. The
    enable before it has the same bound; one that runs past it is a failed start (enable undone).
    Broken off past the preflight (Ctrl-C, SIGTERM: exit 130; a dropped or timed-out command), the
    switch is settled by the unit's real state and says which: started, it is finished (lease ended,
    health not verified: restore-service verifies it); not started, it is rolled back (an enable it
    made is undone, the lease kept); unreadable, said as unknown.

    `mode HOST`: show the mode, holder, reason and expiry. An expired lease is shown as expired and is
    never taken over silently. Every switch is an audit line on the host (state/audit.log).

    --json (`ddtreectl.mode/1`): a switch prints its document also when it fails, with what it had
    done by then (`stopped`, `drain`, `gpus`, `restore`) beside `error`.

    Exit codes: 0 done; 7 GPUs busy/unknown; 8 someone else holds the host (lease or switch lock);
    5 a step failed (the gate's phase and journal are shown); 4 unreachable.
    """
    from ddtreectl.cli.common import load_inventory
    from ddtreectl.operations.gpus import SampleOptions
    from ddtreectl.operations.mode import SwitchResult, read_mode, switch_to_dev, switch_to_prod
    from ddtreectl.probes.mode_lease import parse_duration
    from ddtreectl.transport import connect
    from ddtreectl.ui import console, mode_view, units_view

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect(mode_view.SCHEMA, fan_out=False, host=host_name)
    inventory = load_inventory()
    host = inventory.host(host_name)
    if target not in (None, "dev", "prod"):
        from ddtreectl.inventory.models import did_you_mean

        raise UsageError(f"unknown mode {target!r}{did_you_mean(target, ('dev', 'prod'))}",
                         hint=f"ddtreectl mode {host.name} [dev|prod]")
    if target == "dev" and not reason.strip():
        raise UsageError("--reason is required to take a host for development",
                         hint=f"ddtreectl mode {host.name} dev --reason 'benchmark the new kernel'")
    try:
        ttl_s = parse_duration(ttl)
    except ValueError as err:
        raise UsageError(f"--ttl: {err}") from None

    def step(text: str) -> None:
        if not json_out:
            console.stderr().print(f"{host.name}: {text}")

    # Filled in as the switch goes: a switch that fails after it changed the host (production stopped,
    # then the GPUs never went idle) still prints the switch document saying so, not a bare error.
    partial = SwitchResult(host.name, target) if target is not None else None
    try:
        with connect(host, inventory) as transport:
            if target is None:
                mode_view.show_mode(host.name, read_mode(transport, host.remote_root), as_json=json_out)
                return
            if target == "dev":
                result = switch_to_dev(transport, inventory, host, reason=reason.strip(), ttl_s=ttl_s,
                                       drain_timeout_s=drain_timeout, idle_timeout_s=idle_timeout, force=force,
                                       sample=SampleOptions(), on_step=step, result=partial)
            else:
                result = switch_to_prod(transport, inventory, host, force=force, on_step=step, result=partial,
                                        on_event=(lambda event: None) if json_out else units_view.phase_printer)
            now = read_mode(transport, host.remote_root).now
    except DdtreeError as err:
        if json_out and partial is not None:
            mode_view.show_switch(partial, int(time.time()), as_json=True, error=err)
        elif partial is not None:  # what the switch changed before the error (e.g. units removed)
            mode_view.show_warnings(partial)
        raise
    failure = result.failure_error()
    mode_view.show_switch(result, now, as_json=json_out, error=failure)
    if failure is not None:
        raise failure
