"""Showing rendered units, drift and the restore gate's progress."""

from __future__ import annotations

from typing import Mapping, Sequence

from rich.markup import escape

from ddtreectl.errors import ServiceStartError
from ddtreectl.operations.restore import RestoreResult
from ddtreectl.operations.service_gate import PhaseEvent
from ddtreectl.operations.units import Drift
from ddtreectl.render.units import RenderedService
from ddtreectl.ui import console, json_doc
from ddtreectl.ui.json_doc import error_json


def show_rendered(rendered: RenderedService) -> None:
    out = console.stdout()
    for f in rendered.files:
        out.print(f"[bold]# {escape(rendered.host)}:{escape(f.path)}[/bold] (mode {f.mode:o}, sha256 {f.sha256[:12]})")
        out.print(escape(f.content), end="" if f.content.endswith("\n") else "\n")
    if rendered.env_file:
        out.print(f"[dim]# secrets: {escape(rendered.env_file)} (0600, never rendered or shown)[/dim]")


def show_drift(host: str, found: Sequence[Drift]) -> None:
    out = console.stdout()
    if not found:
        out.print(f"{escape(host)}: installed units match the rendered ones")
        return
    for d in found:
        out.print(f"[yellow]{escape(host)}: {escape(d.describe())}[/yellow]")
        if d.diff:
            out.print(escape(d.diff), end="" if d.diff.endswith("\n") else "\n")


DRIFT_SCHEMA = "ddtreectl.render-diff/1"


def drift_json(host: str, found: Sequence[Drift]) -> dict[str, object]:
    """`render --diff --json`: ok means compared (drift or not: the command exits 0 either way)."""
    return {"schema": DRIFT_SCHEMA, "exit_code": 0, "error": None, "host": host, "ok": True,
            "drift": [{"kind": d.kind, "path": d.path, "diff": d.diff} for d in found]}


def phase_printer(event: PhaseEvent) -> None:
    """Live view of the gate: one line per phase transition, on stderr."""
    err = console.stderr()
    mark = {"running": "…", "passed": "[green]✓[/green]", "failed": "[red]✗[/red]"}[event.status]
    timing = "" if event.status == "running" else f" ({event.elapsed_s:.1f} s)"
    detail = f" — {escape(event.detail)}" if event.detail else ""
    err.print(f"{escape(event.host)}: {mark} {event.phase}{timing}{detail}")


RESTORE_SCHEMA = "ddtreectl.restore-service/1"


def restore_entry(r: RestoreResult) -> dict[str, object]:
    return {
        "host": r.host, "unit": r.unit, "ok": r.ok, "started": r.started, "enabled": r.enabled,
        "duration_s": round(r.duration_s, 3), "warnings": r.warnings,
        "units_removed": r.units_removed,
        "phases": _phases(r.phases),
        "failure": None if r.failure is None else {
            "phase": r.failure.phase, "elapsed_s": round(r.failure.elapsed_s, 3),
            "reason": r.failure.reason, "journal": r.failure.journal},
        # A failed gate is this host's exit 5, said the way every --json says a host's failure.
        "error": None if r.failure is None else {
            "message": f"{r.unit} failed in phase '{r.failure.phase}' after {r.failure.elapsed_s:.1f} s: "
                       f"{r.failure.reason}", "hint": f"ddtreectl logs {r.host}", "exit_code": 5},
    }


def failed_entry(host: str, unit: str | None, e: BaseException, done: RestoreResult | None = None) -> dict[str, object]:
    """A host that raised instead of reaching the gate's verdict. What it did on the host before the
    error stays in the entry: `done` is the restore's own record (units of an older name removed,
    the enable, the start, the phases passed), kept however the restore ended (a start that timed
    out with its state unreadable, a dropped connection); a failed enable/start (ServiceStartError)
    also says whether its enable may have taken."""
    start = e if isinstance(e, ServiceStartError) else None
    return {"host": host, "unit": unit, "ok": False, "started": done.started if done else False,
            "enabled": bool((start and start.enabled) or (done and done.enabled)), "duration_s": None,
            "warnings": list(start.warnings) if start else list(done.warnings) if done else [],
            "units_removed": list(done.units_removed) if done else list(start.units_removed) if start else [],
            "phases": _phases(done.phases) if done else [], "failure": None,
            "error": error_json(e)}


def _phases(phases: Sequence[PhaseEvent]) -> list[dict[str, object]]:
    return [{"phase": p.phase, "status": p.status, "elapsed_s": round(p.elapsed_s, 3), "detail": p.detail}
            for p in phases]


def _done_before(e: BaseException, done: RestoreResult | None) -> list[str]:
    """The text output's account of what a failed host's restore had changed before its error."""
    lines = list(e.warnings) if isinstance(e, ServiceStartError) else list(done.warnings) if done else []
    if done is not None and (done.enabled or done.started is not False):
        did = [f"enabled {done.unit}" if done.enabled else "",
               f"started {done.unit}" if done.started else
               f"sent the start of {done.unit} (whether it took is unknown)" if done.started is None else ""]
        lines.append("done before the error: " + ", ".join(d for d in did if d))
    return lines


def show_restore(results: Sequence[RestoreResult], *, as_json: bool,
                 errors: Sequence[tuple[str, str | None, BaseException]] = (), exit_code: int = 0,
                 targets: Sequence[str] = (), done: Mapping[str, RestoreResult] | None = None) -> None:
    """The per-host outcomes; `errors` (host, unit, error) are the hosts that raised before or instead
    of a gate result, listed in --json too so a script sees every targeted host; `done` the record
    of what each host's restore had changed (see failed_entry)."""
    out = console.stdout()
    done = done or {}
    if as_json:
        entries: dict[str, dict[str, object]] = {r.host: restore_entry(r) for r in results}
        for host, unit, e in errors:
            entries[host] = failed_entry(host, unit, e, done.get(host))
        order = list(targets) + [h for h in entries if h not in targets]
        json_doc.emit({"schema": RESTORE_SCHEMA, "exit_code": exit_code, "ok": exit_code == 0, "error": None,
                       "hosts": [entries[h] for h in order if h in entries]})
        return
    for host, _, e in errors:  # a failed host still says what was done before its error (units removed)
        for w in _done_before(e, done.get(host)):
            out.print(f"[yellow]{escape(host)}: warning: {escape(w)}[/yellow]")
    for r in results:
        for w in r.warnings:
            out.print(f"[yellow]{escape(r.host)}: warning: {escape(w)}[/yellow]")
        if r.ok:
            how = "started and verified" if r.started else "already running; verified"
            out.print(f"[green]{escape(r.host)}: {escape(r.unit)} {how} in {r.duration_s:.1f} s[/green]"
                      + ("" if r.enabled else " (not enabled at boot: --no-enable)"))
        elif r.failure is not None:
            f = r.failure
            out.print(f"[red]{escape(r.host)}: {escape(r.unit)} failed in phase '{f.phase}' after "
                      f"{f.elapsed_s:.1f} s: {escape(f.reason)}[/red]")
            out.print("[dim]last journal lines:[/dim]")
            out.print(escape(f.journal.rstrip()))
