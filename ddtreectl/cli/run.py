"""`ddtreectl run HOST -- CMD...`: a development command in the host's current release directory."""

from __future__ import annotations

import sys

import typer

from ddtreectl.cli.app import app


@app.command()
def run(
    host_name: str = typer.Argument(..., metavar="HOST", help="The host to run on."),
    command: list[str] = typer.Argument(..., metavar="-- CMD...", help="The command and its arguments."),
    force: bool = typer.Option(False, "--force", help="Run without holding the host's development lease "
                               "(recorded in the audit log)."),
    timeout: float = typer.Option(86400.0, "--timeout", min=1.0, help="Kill the command after this many seconds."),
) -> None:
    """Run CMD in <remote_root>/current on HOST, streaming its output; exit with CMD's exit status.

    Allowed only while HOST is in development mode held by you (`ddtreectl mode HOST dev`), so nobody
    starts a benchmark on a serving host by accident. Another holder: exit 8; a host in production:
    exit 7; --force runs anyway and records it. Arguments are passed as words, not through a shell:
    use `-- sh -c '…'` for pipes and redirections. Ctrl-C stops a local command; over SSH the
    command keeps running on the host until it ends or --timeout (`ddtreectl gpus HOST` shows it,
    and `mode HOST prod` refuses while it holds a GPU).

    Exit codes: CMD's own exit status once it ran; before that 7 host in production, 8 another
    holder, 5 no release deployed, 4 unreachable, 3 inventory invalid or unknown host.
    """
    from ddtreectl.cli.common import load_inventory
    from ddtreectl.operations.dev_run import run_dev
    from ddtreectl.transport import connect

    inventory = load_inventory()
    host = inventory.host(host_name)

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    with connect(host, inventory) as transport:
        code = run_dev(transport, host, command, force=force, timeout_s=timeout, on_line=emit)
    if code:
        raise typer.Exit(code)
