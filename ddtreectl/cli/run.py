"""`ddtreectl run HOST -- CMD...`: a development command in the host's current release directory."""

from __future__ import annotations

import shlex
import sys
import time

import typer

from ddtreectl.cli.app import app

RUN_SCHEMA = "ddtreectl.run/1"


@app.command()
def run(
    host_name: str = typer.Argument(..., metavar="HOST", help="The host to run on."),
    command: list[str] = typer.Argument(..., metavar="-- CMD...", help="The command and its arguments."),
    force: bool = typer.Option(False, "--force", help="Run without holding the host's development lease "
                               "(recorded in the audit log)."),
    timeout: float = typer.Option(86400.0, "--timeout", min=1.0, help="Kill the command after this many seconds."),
    json_out: bool = typer.Option(False, "--json", help="Collect the output into one ddtreectl.run/1 document "
                                  "on stdout instead of streaming it."),
) -> None:
    """Run CMD in <remote_root>/current on HOST, streaming its output; exit with CMD's exit status.

    Allowed only while HOST is in development mode held by you (`ddtreectl mode HOST dev`), so nobody
    starts a benchmark on a serving host by accident. Another holder: exit 8; a host in production:
    exit 7; --force runs anyway and records it. Arguments are passed as words, not through a shell:
    use `-- sh -c '…'` for pipes and redirections. Ctrl-C (SIGTERM, SIGHUP) stops the command and
    its children, over SSH too (its process group is killed over the same connection); a command
    that detached itself (setsid, nohup &) is not followed (`ddtreectl gpus HOST` shows what still
    holds a GPU, and `mode HOST prod` refuses while anything does).

    --json prints one `ddtreectl.run/1` document when CMD ends (README, "JSON output"): `host`, `ok`,
    `error` (null once CMD ran, whatever its status), `command`, `command_exit_code`, `output` (its
    stdout and stderr lines, in order), `timed_out` and `duration_s`; a refusal has `error` set. A CMD
    killed at --timeout: exit 5, `error` set, `timed_out` true, `command_exit_code` null and `output`
    what it printed until then (its last line too when that had no newline yet).

    Exit codes: CMD's own exit status once it ran; before that 7 host in production, 8 another
    holder, 5 no release deployed or --timeout reached, 4 unreachable, 3 inventory invalid or unknown host.
    """
    from ddtreectl.cli.common import load_inventory
    from ddtreectl.errors import RunTimeoutError
    from ddtreectl.operations.dev_run import run_dev
    from ddtreectl.transport import connect

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect(RUN_SCHEMA, fan_out=False, host=host_name)
    inventory = load_inventory()
    host = inventory.host(host_name)
    output: list[str] = []

    def emit(line: str) -> None:
        if json_out:
            output.append(line)
            return
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    started = time.monotonic()

    def document(code: int, error: dict[str, object] | None, timed_out: bool = False) -> None:
        json_doc.emit({"schema": RUN_SCHEMA, "exit_code": code, "ok": code == 0, "error": error, "host": host.name,
                       "command": shlex.join(command), "command_exit_code": None if timed_out else code,
                       "output": output, "timed_out": timed_out, "duration_s": round(time.monotonic() - started, 3)})

    try:
        with connect(host, inventory) as transport:
            code = run_dev(transport, host, command, force=force, timeout_s=timeout, on_line=emit)
    except RunTimeoutError as err:
        # The command ran and was killed at --timeout: what it printed until then is the document's
        # (a refusal before it started has no output and gets the error boundary's document).
        if json_out:
            document(int(err.exit_code), json_doc.error_json(err), timed_out=True)
        raise
    if json_out:
        document(code, None)
    if code:
        raise typer.Exit(code)
