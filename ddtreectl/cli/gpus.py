"""`ddtreectl gpus [TARGET...]`: are the GPUs idle, and if not, who uses them."""

from __future__ import annotations

from typing import Optional

import typer

from ddtreectl.cli.app import app
from ddtreectl.errors import ExitCode


@app.command()
def gpus(
    targets: Optional[list[str]] = typer.Argument(
        None, metavar="[TARGET]...", help="Host names, group names or `all` (default: every host)."),
    wait_idle: bool = typer.Option(False, "--wait-idle", help="Sample again until idle or --timeout (not when "
                                   "sampling cannot change the answer: no nvidia-smi, a GPU count other than the "
                                   "inventory's)."),
    timeout: float = typer.Option(600.0, "--timeout", min=0.0, help="Seconds --wait-idle waits at most."),
    samples: int = typer.Option(3, "--samples", min=1, max=60, help="nvidia-smi samples per window."),
    interval: float = typer.Option(1.0, "--interval", min=0.0, max=60.0, help="Seconds between samples."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON (schema ddtreectl.gpus/1)."),
) -> None:
    """Show per GPU who uses it (pid, user, command, memory; the service's own processes named as
    such), memory and utilization over several samples, and a verdict per host:

    idle (no compute process, memory at most max(512 MiB, 1%), utilization 0 in every sample, no
    serving or ddtree-dev-* unit active), busy (which signal: processes, memory, utilization, unit),
    or unknown ([N/A] fields, invisible PIDs, nvidia-smi missing, failing or too slow, a GPU count
    other than the inventory's `gpus:`, GPUs listed on a host declared gpus: 0 included) — unknown
    is never idle. One round trip per host samples everything.
    --json (`ddtreectl.gpus/1`): `samples` counts the nvidia-smi readings taken: 0, with
    `nvidia_smi_missing` true and `nvidia_smi_ms` null, where nvidia-smi is not installed. A host
    the inventory declares GPU-less (gpus: 0) needs no nvidia-smi: without one its verdict rests on
    the units alone (`no_gpus` true); a host that declares GPUs and cannot read them is unknown.

    Exit codes: 0 every host idle; 7 some host busy or unknown; 4 no host could be asked (a
    host's key or identity refused: 4 whatever the others said); 6 some could be asked, some not.
    """
    from ddtreectl.cli.common import load_inventory
    from ddtreectl.fleet import run_on_hosts
    from ddtreectl.inventory.models import Host
    from ddtreectl.operations.gpus import GpuCheck, SampleOptions, check_gpus
    from ddtreectl.operations.gpus import wait_idle as wait_until_idle
    from ddtreectl.transport import connect
    from rich.markup import escape

    from ddtreectl.ui import console, gpus_view

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect(gpus_view.SCHEMA, fan_out=True)
    inventory = load_inventory()
    hosts = inventory.resolve(targets or [])
    options = SampleOptions(samples=samples, interval_s=interval)

    def one(host: Host) -> GpuCheck:
        with connect(host, inventory) as transport:
            if wait_idle:
                return wait_until_idle(transport, inventory, host, options, timeout_s=timeout)
            return GpuCheck(host.name, check_gpus(transport, inventory, host, options))

    window = samples * (interval + 25) + 60
    fleet = run_on_hosts(hosts, one, deadline_s=(timeout + window if wait_idle else window),
                         deadline_option="--timeout" if wait_idle else None)
    checks = [r.value for r in fleet.results if r.value is not None]
    errors = [(r.host.name, r.error) for r in fleet.failed if r.error is not None]
    if fleet.failed:
        code = fleet.exit_code()
    else:
        code = int(ExitCode.OK if all(c.verdict.idle for c in checks) else ExitCode.GPUS_BUSY)
    if json_out:
        json_doc.emit(gpus_view.gpus_json([h.name for h in hosts], checks, errors, code))
    else:
        for check in checks:
            gpus_view.show_check(check)
    for _, error in errors:
        hint = getattr(error, "hint", None)
        console.stderr().print(f"[red]error: {escape(str(error))}[/red]" + (f"\nhint: {escape(hint)}" if hint else ""))
    if code:
        raise typer.Exit(code)
