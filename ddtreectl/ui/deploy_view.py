"""Deploy's per-host progress view (Rich, on stderr), its result table and JSON, and the plan view."""

from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Sequence

from rich.markup import escape

from ddtreectl.operations.deploy import DeployEvent, DeployResult
from ddtreectl.operations.plan import PlanResult, RollbackResult
from ddtreectl.ui import console, json_doc
from ddtreectl.ui.json_doc import error_json

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

class DeployProgress:
    """One progress line per host: phase, a bar (rsync percent, ninja steps) and the latest detail.
    Use as a context manager; `event` is thread-safe (hosts report from fleet threads)."""

    def __init__(self, hosts: Sequence[str], *, enabled: bool = True) -> None:
        self._enabled = enabled and console.stderr().is_terminal
        self._plain = enabled and not self._enabled  # not a terminal: one line per phase change
        self._lock = threading.Lock()
        self._phase: dict[str, str] = {}
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._hosts = list(hosts)

    def __enter__(self) -> "DeployProgress":
        if self._enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            # The elapsed time before the detail, and the detail cut to what is left of the line:
            # with the detail last but one, Rich squeezed the bar and cut the time ("0:01:…").
            self._progress = Progress(TextColumn("{task.fields[host]:<16}"), TextColumn("{task.fields[phase]:<9}"),
                                      BarColumn(bar_width=_BAR), TimeElapsedColumn(),
                                      TextColumn("{task.fields[detail]}"), console=console.stderr(), transient=False)
            self._progress.start()
            for h in self._hosts:
                self._tasks[h] = self._progress.add_task("", total=None, host=h, phase="waiting", detail="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def event(self, e: DeployEvent) -> None:
        with self._lock:
            if self._progress is not None:
                task = self._tasks[e.host]
                longest = max((len(h) for h in self._hosts), default=16)  # the host column fits the longest
                room = max(12, self._progress.console.width - _FIXED - max(0, longest - 16))
                detail = escape(_cut(progress_detail(e), room))
                if e.total is not None:
                    self._progress.update(task, phase=e.phase, detail=detail, total=e.total,
                                          completed=e.completed or 0)
                else:
                    self._progress.update(task, phase=e.phase, detail=detail,
                                          total=1 if e.phase == "done" else None,
                                          completed=1 if e.phase == "done" else 0)
            elif self._plain and (self._phase.get(e.host) != e.phase or e.phase == "verify"):
                # Each step of the restart's health gate too: a model loading for many minutes showed
                # "verify unit active" and then nothing until the end (restore-service prints each).
                said = f"{e.phase} {e.detail}" if e.detail else f"{e.phase}: {_DOING[e.phase]}" \
                    if e.phase in _DOING else e.phase
                console.stderr().print(f"{escape(e.host)}: {escape(said)}".rstrip())
            self._phase[e.host] = e.phase


_BAR = 16
# What a step does, said on its line when the step gives no detail of its own: "h: lock", "h: probe",
# "h: units", "h: switch" told an operator new to deploy little about what the host was doing.
_DOING = {
    "lock": "taking the host's deploy lock",
    "probe": "reading the host's releases, GPUs and units",
    "sync": "copying the engine tree to the host (rsync)",
    "selftest": "running the engine self-test on the host",
    "units": "rendering the service units, installing what changed",
    "switch": "pointing `current` at the new release",
    "restart": "restarting the service, then its health gate",
}
_FIXED = 16 + 9 + _BAR + 7 + 4  # host, phase, bar, elapsed h:mm:ss, the spaces between the columns


def progress_detail(e: DeployEvent) -> str:
    """The words after the bar: rsync's percent and bytes, ninja's `[n/m]` and what that step makes
    (the bar alone showed neither number)."""
    if e.phase == "sync" and e.total and e.completed is not None:
        return f"{e.completed * 100 / e.total:.0f}% {e.detail}".rstrip()
    if e.phase == "build" and e.total and e.completed is not None:
        words = e.detail.split()
        what = e.detail
        if words and words[0] in ("Building", "Linking"):  # "Building CUDA object CMakeFiles/x.dir/src/a.cu.o"
            what = ("linking " if words[0] == "Linking" else "") + words[-1].rsplit("/", 1)[-1]
        return f"[{e.completed:.0f}/{e.total:.0f}] {what}"
    return e.detail or _DOING.get(e.phase, "")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _archs(archs: str, source: str) -> str:
    """"archs 90 (the host's GPUs)"; no archs chosen reads "archs: the engine's default", not the
    "archs engine default (engine default)" it printed before."""
    if not archs:
        return "archs: the engine's default"
    return f"archs {archs} ({source})" if source else f"archs {archs}"


def stale_running_note(host: str, units: Sequence[str]) -> str:
    return (f"STALE unit(s) {', '.join(units)} still running, no longer rendered for {host} (they hold "
            f"their port and GPUs): `ddtreectl deploy {host} --restart` stops, disables and removes them")


def describe(r: DeployResult) -> str:
    """One line per host: what happened, release ids in full (never cut), build, self-test, units, time."""
    if r.action == "noop":
        # "noop X · ... · service restarted" read as if the restart had not happened (--json: "noop").
        parts = [f"{r.release} already current: nothing built or switched"]
    else:
        parts = [f"{r.action} {r.release}" + (f" (was {r.previous})" if r.previous else "")]
    if r.built:
        parts.append(f"{r.ninja_steps} ninja steps, {_archs(r.archs, r.archs_source)}")
    if r.selftest:
        parts.append(f"self-test {r.selftest}")
    parts.append("units " + (", ".join(p.rsplit("/", 1)[-1] for p in r.units_changed) + " installed"
                             if r.units_changed else "unchanged"))
    if r.units_removed:
        parts.append("removed stale unit(s) " + ", ".join(r.units_removed) + " (stopped, disabled, deleted)")
    if r.stale_running:
        parts.append(stale_running_note(r.host, r.stale_running))
    if r.restarted:
        on = " on it" if r.action == "noop" else ""
        parts.append(f"service restarted{on} and verified healthy" if r.restart_verified else f"service restarted{on}")
    if r.restart_note:
        parts.append(r.restart_note)
    if r.still_running:
        parts.append(f"restart pending: the service still runs {r.still_running} "
                     f"(`ddtreectl deploy {r.host} --restart` restarts and verifies it)")
    if r.pruned:
        parts.append("pruned " + ", ".join(r.pruned))
    parts.append(f"{r.timings.get('total', 0):.1f} s")
    return f"{r.host}: " + " · ".join(parts)


def fan_out_json(schema: str, result_type: type, targets: Sequence[str], results: Sequence[Any],
                 errors: Sequence[tuple[str, BaseException]], exit_code: int) -> dict[str, Any]:
    """The --json document of deploy, deploy --plan and rollback (README, "JSON output"): every targeted
    host in `hosts`, in target order, a failed one with its result fields null and `error` set; `errors`
    repeats the failed hosts in the flat form these commands printed before (kept for scripts)."""
    fields = [f.name for f in dataclasses.fields(result_type)]
    entries: dict[str, dict[str, Any]] = {
        r.host: {**dataclasses.asdict(r), "ok": True, "error": None} for r in results}
    for host, err in errors:
        entries[host] = {**{f: None for f in fields}, "host": host, "ok": False, "error": error_json(err)}
    return {"schema": schema, "exit_code": exit_code, "ok": exit_code == 0, "error": None,
            "hosts": [entries[h] for h in [*targets, *(h for h in entries if h not in targets)] if h in entries],
            "errors": errors_json(errors)}


def show_results(results: Sequence[DeployResult], errors: Sequence[tuple[str, BaseException]], *,
                 as_json: bool, targets: Sequence[str] = (), exit_code: int = 0) -> None:
    for r in results:  # on stderr, --json or not: a summary field is easy to miss, an old server is not harmless
        if r.stale_running:
            console.stderr().print(f"[yellow]warning: {escape(stale_running_note(r.host, r.stale_running))}[/yellow]")
    if as_json:
        json_doc.emit(fan_out_json("ddtreectl.deploy/1", DeployResult, targets, results, errors, exit_code))
        show_errors(errors)
        return
    out = console.stdout()
    for r in results:
        style = "green" if r.action != "noop" else ""
        out.print(escape(describe(r)), style=style)
        if r.compiled:
            out.print(f"  compiled: {escape(', '.join(c.rsplit('/', 1)[-1] for c in r.compiled))}")
        if r.lock_took_over:
            console.stderr().print(f"[yellow]{escape(r.host)}: took over a lock left by a dead ddtreectl: "
                                   f"{escape(r.lock_took_over)}[/yellow]")
    show_errors(errors)


def errors_json(errors: Sequence[tuple[str, BaseException]]) -> list[dict[str, Any]]:
    """The hosts that failed, for --json: without them a script cannot tell a failed host from one
    that was never targeted."""
    return [{"host": h, "error": str(getattr(e, "message", e)), "exit_code": int(getattr(e, "exit_code", 1)),
             "hint": getattr(e, "hint", None)} for h, e in errors]


def show_errors(errors: Sequence[tuple[str, BaseException]]) -> None:
    for host, err in errors:
        hint = getattr(err, "hint", None)
        message = getattr(err, "message", None) or str(err)
        console.stderr().print(f"[red]error: {escape(host)}: {escape(message)}[/red]"
                               + (f"\nhint: {escape(hint)}" if hint else ""))


_FEW_FILES = 10  # a list this short is shown whole (a one-file change); a longer one is summarized
_FIRST_FILES = 5
_TOP_DIRS = 8


def _wrapped_under(head: str, items: Sequence[str], width: int) -> list[str]:
    """`head` then `items` joined by ", ", broken between items (never inside "src/ 120") so that each
    line fits `width`, the lines after the first indented under the first item. Printed as one line,
    a summary of many directories ran past an 80-column terminal, which wrapped it to column 0."""
    pieces = [item + "," for item in items[:-1]] + list(items[-1:])
    lines, line = [], head + pieces[0]
    for piece in pieces[1:]:
        if width and len(line) + 1 + len(piece) > width:
            lines.append(line)
            line = " " * len(head) + piece
        else:
            line += " " + piece
    return [*lines, line]


def file_lines(tag: str, kind: str, paths: Sequence[str], *, all_files: bool = False,
               width: int = 0) -> list[str]:
    """The plan's lines for one kind of change. A first deploy changes every file of the engine tree
    (hundreds): it used to print 40 of them and "... N more", a screen of paths in which the build,
    lock and GPU lines were lost. Past _FEW_FILES: the count per top directory (wrapped to `width`,
    when given), the first few paths and how to see every one (--all-files; --json always has them all)."""
    ordered = sorted(paths)
    if all_files or len(ordered) <= _FEW_FILES:
        return [f"{tag} {path}" for path in ordered]
    dirs: dict[str, int] = {}
    for path in ordered:
        top = path.split("/", 1)[0] + "/" if "/" in path else "./"
        dirs[top] = dirs.get(top, 0) + 1
    by_count = sorted(dirs.items(), key=lambda item: (-item[1], item[0]))
    counts = [f"{d} {n}" for d, n in by_count[:_TOP_DIRS]]
    if len(by_count) > _TOP_DIRS:
        counts.append(f"{len(by_count) - _TOP_DIRS} more directories")
    return [*_wrapped_under(f"{kind} by directory: ", counts, width),
            *(f"{tag} {path}" for path in ordered[:_FIRST_FILES]),
            f"{tag} ... {len(ordered) - _FIRST_FILES} more (`--all-files` lists every path)"]


def show_plans(plans: Sequence[PlanResult], errors: Sequence[tuple[str, BaseException]] = (), *,
               as_json: bool, targets: Sequence[str] = (), exit_code: int = 0, all_files: bool = False) -> None:
    if as_json:
        json_doc.emit(fan_out_json("ddtreectl.deploy-plan/1", PlanResult, targets, plans, errors, exit_code))
        return
    out = console.stdout()
    for p in plans:
        out.print(f"[bold]{escape(p.host)}[/bold]: release {p.release} (current {p.current or 'none'})")
        build = f"build needed ({_archs(p.archs, p.archs_source)})" if p.build_needed \
            else "already built"
        out.print(f"  {build}; {'switch current' if p.switch_needed else 'current stays'}")
        f = p.files
        out.print(f"  files: {len(f.added)} added, {len(f.changed)} changed, {len(f.deleted)} deleted")
        for tag, kind, paths in (("+", "added", f.added), ("~", "changed", f.changed), ("-", "deleted", f.deleted)):
            for line in file_lines(tag, kind, paths, all_files=all_files, width=out.width - 4):
                out.print(f"    {escape(line)}")
        out.print("  units: " + ("; ".join(escape(u) for u in p.units) if p.units else "no change"))
        for diff in p.unit_diffs:
            out.print(escape(diff), end="" if diff.endswith("\n") else "\n")
        for stale in p.stale_units:
            out.print(f"  [yellow]stale unit: {escape(stale)}[/yellow]")
        out.print(f"  lock: {escape(p.lock) if p.lock else 'free'}")
        out.print(f"  GPUs: {escape(p.gpus)}")
        if p.refused:
            out.print(f"  [red]deploy would be refused: {escape(p.refused)}[/red]")


def show_rollbacks(results: Sequence[RollbackResult], errors: Sequence[tuple[str, BaseException]] = (), *,
                   as_json: bool, targets: Sequence[str] = (), exit_code: int = 0) -> None:
    if as_json:
        json_doc.emit(fan_out_json("ddtreectl.rollback/1", RollbackResult, targets, results, errors, exit_code))
        return
    for r in results:
        restarted = (", service restarted and verified healthy" if r.restart_verified else ", service restarted") \
            if r.restarted else ""
        note = f" ({r.restart_note})" if r.restart_note else ""
        pending = (f" · restart pending: the service still runs {r.still_running} (`ddtreectl rollback --host "
                   f"{r.host} --restart` restarts and verifies it next time; now: `systemctl restart` the unit on "
                   f"the host, then `ddtreectl restore-service {r.host}` verifies it)") if r.still_running else ""
        console.stdout().print(escape(f"{r.host}: current -> {r.release} (was {r.previous or 'none'})"
                                      f"{restarted}{note}{pending}"))
