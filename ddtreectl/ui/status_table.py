"""The `ddtreectl status` table: one row per host, the service state in words, warnings inline."""

from __future__ import annotations

import time

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ddtreectl.operations.status import HostStatus, StatusReport
from ddtreectl.probes.facts import HostFacts
from ddtreectl.probes.mode_lease import lease_from_state_files, mode_words
from ddtreectl.probes.words import ServiceKind, gpu_summary, health_words, service_condition

_SERVICE_STYLE: dict[ServiceKind, str] = {
    "running": "green", "starting": "yellow", "restarting": "red", "reloading": "yellow",
    "stopping": "yellow", "failed": "bold red", "stopped-enabled": "yellow",
    "stopped-disabled": "yellow", "stopped-static": "yellow", "masked": "red",
    "not-installed": "dim", "broken": "bold red", "unknown": "magenta",
}


def render_status(report: StatusReport, console: Console) -> None:
    """Print the table, then one line per problem host with its reason and hint."""
    table = _fitting_table(report, console)
    if table is None:
        # Still too narrow (an 80-column terminal over SSH, or a pipe): seven columns wrapped every
        # state into a column of one or two words. One block per host instead, each phrase whole.
        _render_blocks(report, console)
    else:
        # Never crop: Rich would cut the right-hand columns (warnings) off; an overlong line wraps instead.
        console.print(table, crop=False)
    answered = sum(1 for h in report.hosts if h.answered)
    summary = f"{answered}/{len(report.hosts)} hosts answered in {report.elapsed_s:.1f} s"
    console.print(Text(summary, style="green" if answered == len(report.hosts) else "yellow"))
    # Reasons in full below the table (fingerprints must not be cut by a narrow column), one line
    # each when the output is not a terminal: Rich's wrap at 80 columns split the commands in the
    # hints (`ddtreectl set-ip` / `HOST ADDRESS`) and fingerprints across lines of a log or a pipe.
    unwrapped = not console.is_terminal
    for status in report.hosts:
        if status.error:
            console.print(Text(f"{status.host.name}: {status.error}", style="red"), soft_wrap=unwrapped)
            if status.hint:
                console.print(Text(f"  hint: {status.hint}", style="dim"), soft_wrap=unwrapped)


def _fitting_table(report: StatusReport, console: Console) -> Table | None:
    """The ruled table; where it cannot show every word whole (long names), the compact one (no rules,
    shared padding: ~15 columns back); None where neither keeps each column readable."""
    for compact in (False, True):
        table = _table(report, compact=compact)
        if _readable(console, table) and _fit_words(console, table):
            return table
    return None


def _table(report: StatusReport, *, compact: bool) -> Table:
    several = len(report.hosts) > 1
    table = Table(show_lines=several and not compact, pad_edge=False,
                  header_style="bold underline" if compact else "bold", box=None if compact else box.HEAVY_HEAD,
                  collapse_padding=compact)
    # Names, addresses and reachability never wrap; the wordy columns wrap at spaces. A word longer
    # than its column (a release id, a unit name, a path) folds onto the next line where even the
    # compact table cannot show it whole: Rich's default ellipsis cut them at 80 columns.
    for column in ("host", "address", "reach"):
        table.add_column(column, no_wrap=True)
    for column in ("GPUs", "service", "release", "warnings"):
        table.add_column(column, min_width=8, overflow="fold")
    for i, status in enumerate(report.hosts):
        if compact and i:
            table.add_row()  # no rules to tell the hosts' multi-line rows apart: a blank line does
        table.add_row(*_row(status))
    return table


_LABEL = 12  # "  warnings  ": the narrow layout's label column
_READABLE = 20  # columns a wrapping cell needs to hold a phrase ("failed (result exit-code,")


def _readable(console: Console, table: Table) -> bool:
    """Whether the table fits with every wrapping column at least _READABLE wide (or as wide as its
    longest line, if less): narrower, a state reads one word per line."""
    unbounded = console.options.update_width(1 << 16)
    need = Measurement.get(console, unbounded, table).maximum
    for column in table.columns:
        if column.no_wrap:
            continue
        cells = [column.header, *column.cells]
        lo = max((Measurement.get(console, unbounded, c).minimum for c in cells), default=0)
        hi = max((Measurement.get(console, unbounded, c).maximum for c in cells), default=0)
        need -= hi - min(hi, max(lo, _READABLE))
    return need <= console.width


def _render_blocks(report: StatusReport, console: Console) -> None:
    """The narrow layout: per host a line with its name, address and reach, then labelled lines
    (GPUs, service with its mode, release, warnings) whose values wrap under themselves."""
    for i, status in enumerate(report.hosts):
        name, address, reach, *cells = _row(status)
        if i:
            console.print()
        console.print(Text.assemble(name, "  ", address, "  ", reach), crop=False)
        if status.facts is None:
            console.print("  reason below", style="red")
            continue
        for label, cell in zip(("GPUs", "service", "release", "warnings"), cells):
            if not cell:
                continue
            # Wrapped here, under the value (a grid padded every line to its widest with spaces).
            text = cell if isinstance(cell, Text) else Text(cell)
            for j, line in enumerate(text.wrap(console, max(_READABLE, console.width - _LABEL), overflow="fold")):
                line.rstrip()
                console.print(Text.assemble(f"  {label:<8}  " if j == 0 else " " * _LABEL, line), soft_wrap=True)


def _fit_words(console: Console, table: Table) -> bool:
    """Fix the column widths so that every word shows whole, if the console is wide enough; else
    change nothing (Rich then shrinks the widest columns and folds) and return False.

    Rich's own shrinking takes from the widest columns first, below their longest word even while
    a narrower column has room to give: at 80 columns that cut release ids and unit names. Here
    each column gets its longest word, and the room left goes to the columns that wrap, in
    proportion to what they would still need to show on one line."""
    unbounded = console.options.update_width(1 << 16)  # Measurement.get clamps to the width it is given
    ranges: list[tuple[int, int]] = []
    for column in table.columns:
        cells = [column.header, *column.cells]
        lo = max((Measurement.get(console, unbounded, c).minimum for c in cells), default=0)
        hi = max((Measurement.get(console, unbounded, c).maximum for c in cells), default=0)
        lo = max(lo, column.min_width or 0)
        ranges.append((hi, hi) if column.no_wrap else (lo, max(lo, hi)))
    overhead = Measurement.get(console, unbounded, table).maximum - sum(hi for _, hi in ranges)
    room = console.width - overhead - sum(lo for lo, _ in ranges)
    if room < 0:
        return False
    want = [hi - lo for lo, hi in ranges]
    total = sum(want)
    widths = [lo + (min(w, room * w // total) if total else 0) for (lo, _), w in zip(ranges, want)]
    for column, width in zip(table.columns, widths):
        column.width = width
    return True


def _row(status: HostStatus) -> list[Text | str]:
    host = status.host
    address = "local" if host.transport == "local" else (
        host.address if host.port == 22 else f"{host.address}:{host.port}")
    facts = status.facts
    if facts is None:
        reach = Text(status.reach, style="bold red")
        return [host.name, address, reach, "-", "-", "-", Text("reason below", style="red")]
    latency = f"{status.probe_ms:.0f} ms" if status.probe_ms is not None else "?"
    reach = Text(f"ok {latency}", style="green") if status.outcome == "ok" else Text(
        status.reach, style="bold red")
    warnings = list(status.warnings)
    if status.outcome != "ok":
        warnings.insert(0, "REFUSED: reason below")
    return [host.name, address, reach, _gpus(facts, host.gpus),
            _service_and_mode(facts, host.service),
            _release(facts), Text("\n".join(warnings), style="yellow") if warnings else ""]


def _service_and_mode(facts: HostFacts, profile: str | None) -> Text:
    """The service state and, below it, the mode lease (state/mode.json); a host with neither a
    service nor a lease shows no mode (there is nothing to switch)."""
    lease = lease_from_state_files(facts.state_files)
    if lease is None and facts.service is None:
        return _service(facts, profile)
    now = int(time.time())
    style = "dim" if lease is None or lease.mode == "prod" else "red" if lease.expired(now) else "yellow"
    return Text("\n").join([_service(facts, profile), Text(mode_words(lease, now), style=style)])


def _gpus(facts: HostFacts, expected: int) -> Text:
    text = gpu_summary(facts.gpus)
    ok = facts.gpus.status in ("ok", "no-devices") and len(facts.gpus.gpus) == expected
    if facts.gpus.status == "missing" and expected == 0:
        return Text("no GPUs (no nvidia-smi)", style="dim")
    return Text(text, style="" if ok else "yellow")


def _service(facts: HostFacts, profile: str | None) -> Text:
    if facts.service is None:
        return Text("no service profile", style="dim")
    condition = service_condition(facts.service)
    name = facts.service.unit.removesuffix(".service")
    words = condition.words
    since = facts.service.active_since_epoch
    if condition.kind == "running" and since is not None:
        # This machine's clock against the host's timestamp: skew of seconds does not matter here.
        words += f" for {_duration(max(0.0, time.time() - since))}"
    health = health_words(facts.health) if condition.kind == "running" else None
    words += f", {health}" if health else ""
    loading = condition.kind == "running" and facts.health is not None and facts.health.serving is False
    return Text(f"{name}: {words}", style="yellow" if loading else _SERVICE_STYLE[condition.kind])


def _duration(seconds: float) -> str:
    """`45 s`, `12 min`, `3 h 05 min`, `6 d 02 h`."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600:02d} h"


def _release(facts: HostFacts) -> Text:
    rel = facts.release
    if not rel.root_exists:
        return Text("no release deployed", style="dim")
    if rel.current is None:
        return Text("no current release", style="yellow")
    text = rel.current + ("" if rel.build_stamp else " (not built)")
    if rel.restart_pending:
        text += f"\nrunning {rel.running}: restart pending"
    return Text(text, style="" if rel.build_stamp and not rel.restart_pending else "yellow")

