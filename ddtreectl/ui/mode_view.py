"""Showing a host's mode and the outcome of a switch."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from ddtreectl.operations.mode import HostMode, SwitchResult
from ddtreectl.errors import DdtreeError
from ddtreectl.ui import console, json_doc
from ddtreectl.ui.gpus_view import verdict_json
from ddtreectl.ui.json_doc import error_json


SCHEMA = "ddtreectl.mode/1"


def mode_json(host: str, state: HostMode) -> dict[str, Any]:
    lease = state.lease
    return {"schema": SCHEMA, "exit_code": 0, "error": None, "host": host, "ok": True, "mode": state.mode,
            "host_time": state.now, "lease": lease.to_json(state.now) if lease is not None else None}


def show_mode(host: str, state: HostMode, *, as_json: bool) -> None:
    out = console.stdout()
    if as_json:
        json_doc.emit(mode_json(host, state))
        return
    if state.lease is None:
        out.print(f"{escape(host)}: prod (no development lease recorded)")
        return
    expired = state.lease.expired(state.now)
    style = "red" if expired else ("yellow" if state.lease.mode == "dev" else "green")
    out.print(f"[{style}]{escape(host)}: {escape(state.lease.describe(state.now))}[/{style}]")


def switch_json(result: SwitchResult, now: int, error: DdtreeError | None = None) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "exit_code": int(error.exit_code) if error else 0, "error": error_json(error),
        "host": result.host, "to": result.to, "ok": result.ok and error is None,
        "lease": result.lease.to_json(now) if result.lease else None,
        "drain": result.drain.to_json() if result.drain else None, "stopped": result.stopped,
        "gpus": verdict_json(result.verdict) if result.verdict else None,
        "restore": _restore_json(result),
        "forced": result.forced, "warnings": result.warnings,
        # A failed `systemctl start`: nothing started, the enable put back, `lease` the one kept.
        "start_failure": None if result.start_failure is None else {
            "error": result.start_failure, "unit": result.unit, "put_back": result.put_back},
        "lease_kept": result.lease_kept,
        # `mode prod` broken off past its preflight: "finished" | "rolled back" | "unknown" (else null).
        "broken_off": result.broken_off,
    }


def _restore_json(result: SwitchResult) -> dict[str, Any] | None:
    """What the restore did, also when its enable or start failed (no RestoreResult then): what it
    changed before that (units_removed) is on the host all the same."""
    restore = result.restore
    if restore is None and result.start_failure is not None:
        return {"ok": False, "started": False, "duration_s": None, "units_removed": result.units_removed,
                "failure": {"phase": "start", "reason": result.start_failure, "journal": None}}
    if restore is None and result.units_removed:  # an error ended the restore after it removed them
        return {"ok": False, "started": None, "duration_s": None, "units_removed": result.units_removed,
                "failure": None}
    return None if restore is None else {
        "ok": restore.ok, "started": restore.started, "duration_s": round(restore.duration_s, 3),
        "units_removed": restore.units_removed,
        "failure": None if restore.failure is None else {
            "phase": restore.failure.phase, "reason": restore.failure.reason, "journal": restore.failure.journal}}


def show_warnings(result: SwitchResult) -> None:
    """The warnings of a switch an error ended (text output): what it changed before the error."""
    for warning in result.warnings:
        console.stdout().print(f"[yellow]{escape(result.host)}: warning: {escape(warning)}[/yellow]")


def show_switch(result: SwitchResult, now: int, *, as_json: bool, error: DdtreeError | None = None) -> None:
    """The outcome; `error` is what the switch ends with (a failed gate), for the JSON document."""
    out = console.stdout()
    if as_json:
        json_doc.emit(switch_json(result, now, error))
        return
    for line in result.forced:
        out.print(f"[yellow]{escape(result.host)}: --force: {escape(line)}[/yellow]")
    for warning in result.warnings:
        out.print(f"[yellow]{escape(result.host)}: warning: {escape(warning)}[/yellow]")
    restore = result.restore
    if restore is not None and restore.failure is not None:
        f = restore.failure
        out.print(f"[red]{escape(result.host)}: {escape(restore.unit)} failed in phase '{f.phase}' after "
                  f"{f.elapsed_s:.1f} s: {escape(f.reason)}[/red]")
        out.print("[dim]last journal lines:[/dim]")
        out.print(escape(f.journal.rstrip()))
    if result.start_failure is not None:
        out.print(f"[red]{escape(result.host)}: {escape(result.start_failure)}; nothing was started "
                  f"({escape(result.put_back or '')})[/red]")
    if result.lease is not None:
        kept = " (kept)" if result.lease_kept else ""
        out.print(f"[{'green' if result.ok else 'yellow'}]{escape(result.host)}: "
                  f"{escape(result.lease.describe(now))}{kept}[/]")
