"""Units ddtreectl installed that the inventory no longer renders on a host, and removing them.

A profile whose `unit_name` changed (or a host whose service was removed) used to leave the old unit
installed, enabled and running: it kept the port and the GPUs, survived reboots, and neither `status`
nor `deploy` said so. The status probe now lists such units (`HostFacts.other_units`: the units
recorded in `state/units.list`, plus any unit file carrying the header every rendered unit starts
with, for hosts deployed before the record existed). `deploy` removes them: a stopped one always,
a running one only under `--restart`, because a deploy without `--restart` never interrupts a
serving process; it then says loudly that the old unit still runs and which command removes it.
"""

from __future__ import annotations

import posixpath
import shlex
from typing import Sequence

from ddtreectl.errors import RemoteCommandError
from ddtreectl.operations.audit import append_audit, remote_path
from ddtreectl.probes.facts import OtherUnit
from ddtreectl.render.units import UNIT_DIR, RenderedService
from ddtreectl.transport.base import Transport

RECORD = "units.list"  # under <root>/state/: "UNIT [FILE...]" per line, written by deploy


def describe(unit: OtherUnit) -> str:
    """`NAME (active, enabled)`: the state the operator has to act on."""
    return f"{unit.unit} ({unit.active}, {unit.enabled})"


def status_warning(host: str, unit: OtherUnit) -> str:
    """The `status` warning for one unit the inventory no longer renders, with the command that removes it."""
    if unit.running:
        return (f"stale unit {describe(unit)}: no longer rendered for {host} (unit name changed?) but still "
                f"running: it holds its port and GPUs; `ddtreectl deploy {host} --restart` stops, disables "
                "and removes it")
    return (f"stale unit {describe(unit)}: no longer rendered for {host}; "
            f"`ddtreectl deploy {host}` disables and removes it")


def running_refusal(host: str, units: Sequence[OtherUnit], rendered_unit: str) -> RemoteCommandError:
    """The exit-5 refusal of restore-service / mode prod while an old unit still runs."""
    names = [u.unit for u in units]
    return RemoteCommandError(
        f"stale unit {', '.join(describe(u) for u in units)} still running: no longer rendered for {host} "
        f"(unit name changed?); starting {rendered_unit} beside it would fight it for the port and GPUs",
        hint=f"`ddtreectl deploy {host} --restart` stops, disables and removes it and starts {rendered_unit} in "
             f"its place (verified); or stop it on the host (`systemctl disable --now {' '.join(names)}`) and run "
             "this command again, which then removes it",
        host=host)


def removed_note(unit: OtherUnit, host: str) -> str:
    """The warning restore-service / mode prod give for a stopped old unit they removed."""
    return (f"removed stale unit {describe(unit)}: no longer rendered for {host}; disabled and deleted "
            "(audited: unit-removed)")


def record_text(rendered: RenderedService | None, kept: Sequence[str]) -> str:
    """The record deploy leaves: the rendered unit with its files, then the stale units left running
    (so a unit whose file lacks the ddtreectl header is still found next time)."""
    lines = [" ".join([rendered.unit, *(f.path for f in rendered.files)])] if rendered is not None else []
    lines += list(kept)
    return "".join(line + "\n" for line in lines)


def _removal_script(root: str, units: Sequence[str], record: str, enable: str) -> str:
    lines = ["set -eu"]
    for unit in units:
        stem = unit.removesuffix(".service")
        files = [posixpath.join(UNIT_DIR, unit)]
        config = remote_path(root, "config", f"{stem}.yaml")
        # --now stops it (its port and GPUs free for the rendered unit) and drops its enablement links.
        lines.append(f"systemctl disable --now -- {shlex.quote(unit)} >/dev/null 2>&1 || "
                     f"systemctl stop -- {shlex.quote(unit)}")
        lines.append("rm -f -- " + " ".join(shlex.quote(f) for f in files) + f" {config}")
    lines.append("systemctl daemon-reload")
    if enable:  # the rendered unit inherits the boot-time start of the unit it replaces
        lines.append(f"systemctl enable -- {shlex.quote(enable)} >/dev/null 2>&1")
    # A unit that had failed stays listed as failed until reset, although its file is gone.
    lines += [f"systemctl reset-failed -- {shlex.quote(u)} 2>/dev/null || true" for u in units]
    lines.append(_record_command(root, record))
    return "\n".join(lines) + "\n"


def _record_command(root: str, record: str) -> str:
    state = remote_path(root, "state")
    tmp, final = remote_path(root, "state", RECORD + ".tmp"), remote_path(root, "state", RECORD)
    return f"mkdir -p {state} && printf %s {shlex.quote(record)} > {tmp} && mv -f {tmp} {final}"


def write_record(transport: Transport, root: str, record: str, *, host: str, timeout: float = 30) -> None:
    """Write `state/units.list` atomically (temp + rename)."""
    result = transport.run(_record_command(root, record), timeout=timeout)
    if not result.ok:
        raise RemoteCommandError(f"writing {root}/state/{RECORD} failed (exit {result.exit_code}): "
                                 f"{result.stderr.strip()[-400:]}", host=host)


def remove_units(transport: Transport, root: str, units: Sequence[OtherUnit], record: str, *, host: str,
                 rendered_unit: str | None, enable_instead: bool = True, timeout: float = 120) -> bool:
    """Stop, disable and delete `units` (unit file and rendered config), daemon-reload, rewrite the
    record; one round trip, then one audit line per unit removed. When one of them was enabled, the
    rendered unit is enabled in its place (started at boot as the old one was) unless not
    `enable_instead` (restore-service --no-enable); returns whether it was."""
    names = [u.unit for u in units]
    enable = rendered_unit if rendered_unit and enable_instead and any(u.enabled == "enabled" for u in units) \
        else ""
    result = transport.run("sh -s", stdin=_removal_script(root, names, record, enable).encode(), timeout=timeout)
    if not result.ok:
        raise RemoteCommandError(
            f"removing the stale unit(s) {', '.join(names)} failed (exit {result.exit_code}): "
            f"{result.stderr.strip()[-400:]}",
            hint=f"see `systemctl status {names[0]}` on the host; `ddtreectl status {host}` lists what is left",
            host=host)
    for unit in units:
        append_audit(transport, root, "unit-removed", unit=unit.unit, was=f"{unit.active}, {unit.enabled}",
                     reason="no longer rendered for this host", replaced_by=rendered_unit,
                     enabled_instead=bool(enable))
    return bool(enable)
