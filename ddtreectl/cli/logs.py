"""`ddtreectl logs HOST... [-f] [--since] [--json]`: the service's journal, prefixed per host when several."""

from __future__ import annotations

import shlex
import sys
import threading
from typing import List, Optional

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.errors import DdtreeError, ExitCode, InventoryError, RemoteCommandError, UsageError, fan_out_exit_code


@app.command("logs")
def logs_command(
    targets: List[str] = typer.Argument(..., metavar="TARGET...", help="Hosts, groups or `all`."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new lines until Ctrl-C."),
    since: Optional[str] = typer.Option(None, "--since", help="journalctl --since value, e.g. '1 hour ago'."),
    lines: int = typer.Option(100, "--lines", "-n", min=0, help="How many past lines to show."),
    json_out: bool = typer.Option(False, "--json", help="One ddtreectl.logs/1 document on stdout: per host the "
                                  "unit and its journal entries (not with --follow: exit 2)."),
) -> None:
    """Show the journal of each host's service unit (several hosts: lines prefixed with the host).

    --json prints one `ddtreectl.logs/1` document (README, "JSON output"): `hosts`, every target in
    order, each with `host`, `ok`, `error`, `unit` and `entries` (oldest first: `time` in UTC,
    `unix_us`, `priority`, `identifier`, `pid`, `message`), from `journalctl -o json`.

    A host without a service profile has no journal to show: reached through a group or `all` it is
    skipped (a `skipped:` line on stderr; --json: `ok` true, `entries` [], `skipped` says why) and
    does not fail the run; named on the command line it is an error (3). A unit with no entries (never
    started since boot, no journal kept, or none since --since) says so in a line, and exits 0.

    Exit codes: 0 shown (skipped hosts included); 2 --json with --follow; 3 inventory invalid, unknown
    target, a host named on the command line without a service profile, or no targeted host has one;
    4 unreachable; 5 journalctl failed (its message shown); 6 some hosts failed; 130 interrupted.
    """
    from ddtreectl.transport import connect

    if json_out:
        from ddtreectl.ui import json_doc
        from ddtreectl.ui.logs_view import LOGS_SCHEMA

        json_doc.expect(LOGS_SCHEMA, fan_out=True)  # first: the refusal below is a document too
    if json_out and follow:
        # One document is printed when the command ends; a follow never ends.
        raise UsageError("--json cannot follow: it prints one document once the lines are read",
                         hint="drop -f, and run it again (with --since) to poll")
    inventory = load_inventory()
    everyone = inventory.resolve(targets)
    # A fleet-wide `logs all` (or a group) shows what there is: a host that runs no service simply has
    # no journal, which is not a failure of the run. Named by itself, it is what was asked for: an error.
    named = {t for t in targets if t != "all" and t in inventory.hosts}
    skipped = {h.name for h in everyone if inventory.service_of(h) is None and h.name not in named}
    if skipped and len(skipped) == len(everyone):
        raise InventoryError(f"no targeted host ({', '.join(h.name for h in everyone)}) runs a service profile; "
                             "no journal to show",
                             hint=f"set hosts.NAME.service in {inventory.path.name}")
    for name in skipped:
        print(f"{name}: skipped: runs no service profile, no journal to show", file=sys.stderr)
    hosts = [h for h in everyone if h.name not in skipped]
    prefix = len(everyone) > 1
    lock = threading.Lock()
    failures: dict[str, DdtreeError] = {}  # host -> why its journal was not shown
    journals: dict[str, tuple[str, str]] = {}  # --json: host -> (unit, journalctl -o json output)

    def show(host_name: str, line: str) -> None:
        if line == "-- No entries --":  # journalctl's words; they read as if the command had failed
            unit = inventory.service_of(inventory.hosts[host_name])
            name = unit.unit if unit else "the unit"
            line = (f"no journal entries for {name} since {since!r}" if since else
                    f"no journal entries for {name} yet (not started since boot, or no journal is kept)")
        with lock:
            print(f"{host_name}: {line}" if prefix else line, flush=True)

    def one(host_index: int) -> None:
        host = hosts[host_index]
        service = inventory.service_of(host)
        if service is None:
            failures[host.name] = InventoryError("runs no service profile; no journal to show", host=host.name,
                                                 hint=f"set hosts.{host.name}.service in {inventory.path.name}")
            return
        argv = ["journalctl", "-u", service.unit, "--no-pager", "-n", str(lines), "-o",
                "json" if json_out else "short-iso"]
        argv += ["--since", since] if since else []
        argv += ["-f"] if follow else []
        try:
            with connect(host, inventory) as transport:
                result = transport.run(shlex.join(argv), timeout=7 * 24 * 3600 if follow else 60,
                                       on_line=None if json_out else (lambda line: show(host.name, line)))
            if result.ok and json_out:
                journals[host.name] = (service.unit, result.stdout)
            if not result.ok:  # e.g. a --since journalctl cannot parse: say so, never "no lines"
                words = result.stderr.strip().splitlines()[-3:] or [f"exit {result.exit_code}"]
                failures[host.name] = RemoteCommandError(
                    f"journalctl failed: {' / '.join(words)}", host=host.name,
                    hint="check --since (e.g. '1 hour ago', '2026-11-30 05:00')"
                    if since else f"run journalctl -u {service.unit} on the host")
        except DdtreeError as err:
            failures[host.name] = err

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(hosts))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    code = fan_out_exit_code([int(err.exit_code) for err in failures.values()], len(hosts))
    if json_out:
        from ddtreectl.ui.logs_view import logs_json

        services = {h.name: inventory.service_of(h) for h in everyone}
        units = {name: service.unit if service else None for name, service in services.items()}
        json_doc.emit(logs_json([h.name for h in everyone], units, journals, failures, code, skipped))
    if len(failures) == 1 and len(hosts) == 1:
        raise next(iter(failures.values()))
    for err in failures.values():  # each with its own hint; then one exit code for the fan-out
        print(f"error: {err}" + (f"\nhint: {err.hint}" if err.hint else ""), file=sys.stderr)
    if failures:
        raise typer.Exit(code)
