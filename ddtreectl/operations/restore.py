"""Bring a host's production service back, verified healthy: preflight, enable, start, phased gate."""

from __future__ import annotations

import re
import shlex
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ddtreectl.errors import (CommandTimeoutError, GpusBusyError, InterruptedByOperatorError, InventoryError,
                              LockHeldError, RemoteCommandError, ServiceStartError)
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations import stale_units
from ddtreectl.operations.activate import list_releases
from ddtreectl.operations.audit import append_audit
from ddtreectl.operations.service_gate import GateFailure, PhaseEvent, ServiceGate
from ddtreectl.operations.units import drift, drift_hint, read_installed
from ddtreectl.probes.facts import OtherUnit
from ddtreectl.probes.gpu_holders import gpu_holders
from ddtreectl.probes.mode_lease import lease_from_state_files, utc
from ddtreectl.probes.status import probe_status
from ddtreectl.render.units import RenderedService, render_service
from ddtreectl.transport.base import Transport


@dataclass(frozen=True)
class RestoreOptions:
    enable: bool = True
    force: bool = False
    # Refuse a host held for development (state/mode.json). `mode HOST prod` passes False: it ends
    # the lease itself, after this same restore.
    respect_lease: bool = True


@dataclass
class RestoreResult:
    host: str
    unit: str
    # False: it was already running and was only verified. None (only in the record of a restore an
    # error ended, see restore_host's `result`): a start was sent, and the error came before it was known
    # whether it took.
    started: bool | None = False
    enabled: bool = False
    failure: GateFailure | None = None
    phases: list[PhaseEvent] = field(default_factory=list)
    duration_s: float = 0.0
    warnings: list[str] = field(default_factory=list)
    units_removed: list[str] = field(default_factory=list)  # stopped units of an older name (stale_units)
    # The preflight passed and the host is being changed (units removed, enable, start, gate): an error
    # or interrupt from here on may leave the unit enabled or started (mode prod settles it).
    changing: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None


def _rendered(inventory: Inventory, host: Host) -> RenderedService:
    rendered = render_service(inventory, host)
    if rendered is None:
        raise InventoryError(
            "runs no service profile; nothing to restore",
            hint=f"set hosts.{host.name}.service in {inventory.path.name}",
            host=host.name,
        )
    return rendered


@dataclass
class Preflight:
    warnings: list[str]  # refusals --force turned into notes
    stale: tuple[OtherUnit, ...]  # stopped units of an older name, removed before the start
    record: str  # what state/units.list says once they are gone


def preflight(transport: Transport, host: Host, rendered: RenderedService, options: RestoreOptions) -> Preflight:
    """Refuse unless the host can serve: built release, installed and undrifted unit, no unit of an
    older name running (stale_units), GPUs free of foreign processes."""
    facts = probe_status(transport, unit=rendered.unit, remote_root=host.remote_root,
                         timeout=host.command_timeout)
    warnings: list[str] = []
    lease = lease_from_state_files(facts.state_files)
    if options.respect_lease and lease is not None and lease.mode == "dev":
        # Starting production under a development lease left the lease saying dev beside a running
        # service, and the holder's `run` then put development work on the service's GPUs. --force
        # does not override it: the lease changes hands only through `mode` (audited there).
        raise LockHeldError(
            f"held for development: {lease.describe(int(time.time()))}; restore-service does not end a "
            "development lease",
            hint=f"`ddtreectl mode {host.name} prod` ends it and restores through the same gate (another "
                 "operator's live lease needs --force, recorded in the audit log)",
            host=host.name)
    # Before the GPU check: the old unit's server would otherwise read as a "foreign process", which
    # --force lets through, and two servers would then fight for the port and the GPUs.
    running = [u for u in facts.other_units if u.running]
    if running:
        raise stale_units.running_refusal(host.name, running, rendered.unit)
    release = facts.release
    if not (release.current and release.build_stamp):
        raise RemoteCommandError(
            f"no built release under {host.remote_root} (current: {release.current or 'none'}"
            f"{', no build stamp' if release.current else ''})",
            hint=_no_release_hint(transport, host, release.current),
            host=host.name,
        )
    installed = read_installed(transport, rendered)
    problems = drift(rendered, installed)
    missing = [d for d in problems if d.kind == "missing"]
    if missing:
        raise RemoteCommandError(
            "unit not installed: " + "; ".join(d.describe() for d in missing),
            hint=f"ddtreectl deploy --host {host.name} installs it",
            host=host.name,
        )
    if problems:
        text = "; ".join(d.describe() for d in problems)
        if not options.force:
            raise RemoteCommandError(
                f"installed unit drifted from the rendered one: {text}",
                hint=drift_hint(problems, host.name),
                host=host.name,
            )
        warnings.append(f"started despite drift (--force): {text}")
    gpus = facts.gpus
    if host.gpus > 0 and (gpus.status != "ok" or not gpus.apps_known):
        detail = f"GPU state unknown ({gpus.status}: {gpus.detail or 'no detail'})"
        if not options.force:
            raise GpusBusyError(detail, hint="check nvidia-smi on the host, or --force", host=host.name)
        warnings.append(f"{detail} (--force)")
    holders = gpu_holders(transport, [a.pid for a in gpus.apps if a.pid is not None])
    hidden = [a for a in gpus.apps if a.pid is None]
    foreign = [h for h in holders if not h.belongs_to(rendered.unit)]
    if foreign or hidden:
        described = [h.describe() for h in foreign] + [f"a process on GPU {a.gpu_uuid} (pid not visible)"
                                                       for a in hidden]
        message = "GPUs held by processes other than the service: " + "; ".join(described)
        if not options.force:
            raise GpusBusyError(message, hint="stop them (or `ddtreectl mode HOST prod` after a dev session), "
                                "or --force", host=host.name)
        warnings.append(f"{message} (--force)")
    return Preflight(warnings, facts.other_units, stale_units.record_text(rendered, []))


def _no_release_hint(transport: Transport, host: Host, current: str | None) -> str:
    """Deploy, and, where an older release with a good stamp is still on the host, the rollback that
    activates it without a build (the hint used to name deploy only: a build the operator may not
    want, or cannot run, when a good release is one `current` switch away)."""
    deploy = f"`ddtreectl deploy --host {host.name}` builds and activates the release of your sources"
    try:
        listing = list_releases(transport, host.remote_root)
    except RemoteCommandError:  # the hint is best effort: the refusal itself stands
        return deploy
    good = sorted((r for r in listing.mtimes if r != current and listing.good(r)),
                  key=lambda r: listing.mtimes[r], reverse=True)
    if not good:
        return deploy
    newest = good[0]
    others = f"; other good releases: {', '.join(good[1:])}" if len(good) > 1 else ""
    return (f"{deploy}, or `ddtreectl rollback --host {host.name} --to {newest}` activates release {newest} "
            f"(good build stamp, from {utc(int(listing.mtimes[newest]))}) without a build{others}; "
            f"then `ddtreectl restore-service {host.name}`")


def start_service(transport: Transport, host: Host, unit: str, *, enable: bool,
                  record: RestoreResult | None = None) -> tuple[bool, str | None, list[str]]:
    """Enable (optional) and start the unit unless it already runs; returns whether it was started
    and the host's clock (`@<epoch>`) just before, so a failure shows only this start's journal, and
    notes for the operator (a start that timed out but took).

    A unit crash-looping under Restart=on-failure sits in activating/auto-restart between attempts.
    That is not running: `systemctl start` would only wait for the restart timer (systemd queues a
    start behind it), so it is restarted now, which is what an operator who just fixed the cause of
    the crash asks for; it used to count as running, and the gate then failed at once on the
    auto-restart state (showing the old crash's journal) until the timer happened to fire."""
    quoted = shlex.quote(unit)
    out = transport.run(f"date +@%s; systemctl show -p ActiveState -p SubState -- {quoted}", timeout=15).stdout
    first = out.split("\n", 1)[0].strip()
    since = first if re.fullmatch(r"@\d+", first) else None
    props = dict(line.strip().split("=", 1) for line in out.splitlines() if "=" in line)
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    looping = sub == "auto-restart"
    running = active in ("active", "activating", "reloading") and not looping
    if enable:
        # Bounded by the host's command_timeout like the start (it was a fixed 60 s). A timed-out
        # enable may have taken: it is a failed start with the enable to put back (mode prod does).
        try:
            result = transport.run(f"systemctl enable --quiet -- {quoted}", timeout=host.command_timeout)
        except CommandTimeoutError:
            raise ServiceStartError(
                f"enabling {unit} timed out after {host.command_timeout:g} s (systemd or D-Bus slow to answer); "
                "nothing was started", enabled=True,
                hint=f"check systemd on the host (`systemctl list-jobs`); command_timeout in the inventory bounds "
                     f"it; `ddtreectl status {host.name}` shows the unit", host=host.name) from None
        if not result.ok:
            # Nothing was started: a failed start like the others (mode prod keeps the lease), and one
            # that carries what the restore changed before it (units_removed).
            raise ServiceStartError(
                f"enabling {unit} failed (exit {result.exit_code}): {result.stderr.strip()[-400:]}",
                enabled=False, hint=f"ddtreectl logs {host.name}", host=host.name)
        if record is not None:
            record.enabled = True  # before the start: an error there must not hide the enable
    notes: list[str] = []
    if not running:
        if record is not None:
            record.started = None  # sent: unknown until it answers (the connection may drop meanwhile)
        # Apart from the enable: a failed start must say the unit was enabled by this step (mode prod
        # puts that back, or a reboot would start production under the development lease).
        try:
            result = transport.run(f"systemctl reset-failed -- {quoted} 2>/dev/null || true; "
                                   f"systemctl {'restart' if looping else 'start'} --no-block -- {quoted}",
                                   timeout=host.command_timeout)
        except CommandTimeoutError as timed_out:
            notes.append(_after_start_timeout(transport, host, unit, timed_out, enabled=enable))
        else:
            if not result.ok:
                raise ServiceStartError(
                    f"starting {unit} failed (exit {result.exit_code}): {result.stderr.strip()[-400:]}",
                    enabled=enable, hint=f"ddtreectl logs {host.name}", host=host.name)
    return not running, since, notes


def _after_start_timeout(transport: Transport, host: Host, unit: str, timed_out: CommandTimeoutError, *,
                         enabled: bool) -> str:
    """`systemctl start --no-block` ran past its timeout (systemd or D-Bus slow to answer) and was
    killed: the job may have been queued all the same, and the unit then runs whatever we concluded.
    The unit's real state decides. Running, starting or with a job queued: the start took (returns
    the note to show; the gate judges the rest). Stopped with no job: nothing was started
    (ServiceStartError, as for a failed start). Unreadable too: unknown, said as such (no guess)."""
    quoted = shlex.quote(unit)
    try:
        out = transport.run(f"systemctl show -p ActiveState -p SubState -p Job -- {quoted}",
                            timeout=host.command_timeout)
    except RemoteCommandError as unread:
        raise RemoteCommandError(
            f"starting {unit} timed out ({timed_out.message}) and its state could not be read afterwards "
            f"({unread.message}): it may be starting or not; {unit} is {'enabled' if enabled else 'as it was'}",
            hint=f"`ddtreectl status {host.name}` shows whether {unit} runs; then run the same command again "
                 "(a running unit is verified, not started twice)",
            host=host.name) from None
    props = dict(line.strip().split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    active, sub, job = props.get("ActiveState", ""), props.get("SubState", ""), props.get("Job", "").strip()
    queued = job not in ("", "0")
    state = f"{active or 'unknown'}/{sub or 'unknown'}" + (f", job {job} queued" if queued else "")
    if active in ("active", "activating", "reloading") or queued:
        return (f"`systemctl start` of {unit} timed out and was stopped, but the start took: {unit} is "
                f"{state}")
    raise ServiceStartError(
        f"starting {unit} timed out ({timed_out.message}) and nothing was started: {unit} is {state}, no job "
        "queued", enabled=enabled,
        hint=f"check systemd on the host (`systemctl list-jobs`; `ddtreectl logs {host.name}`)", host=host.name)


def restore_host(
    transport: Transport,
    inventory: Inventory,
    host: Host,
    options: RestoreOptions,
    *,
    gate: bool = True,
    on_event: Callable[[PhaseEvent], None] = lambda event: None,
    result: RestoreResult | None = None,
    cancel: threading.Event | None = None,
) -> RestoreResult:
    """Preflight, enable, start and gate one host. For a multi-node service the caller starts the
    other ranks first with `gate=False` and gates rank 0, the only one serving HTTP.

    `result`, when given, is filled in as the restore changes the host (units removed, the enable,
    the start, the phases passed), so a caller still knows what was done when an error ends the
    restore half way: a start that timed out with its state unreadable, a connection that dropped.

    `cancel` (Ctrl-C, restore-service's own): set before the start, nothing is started; set during the
    gate, it stops waiting and raises InterruptedByOperatorError saying the unit's state (started, its
    health unknown), as deploy --restart does; the audit line records the phase (`interrupted`)."""
    started_at = time.monotonic()
    rendered = _rendered(inventory, host)
    service = inventory.service_of(host)
    assert service is not None
    if result is None:
        result = RestoreResult(host=host.name, unit=rendered.unit)
    result.unit = rendered.unit
    checked = preflight(transport, host, rendered, options)
    result.warnings = checked.warnings
    if cancel is not None and cancel.is_set():
        raise InterruptedByOperatorError(f"interrupted before the start: nothing was changed ({rendered.unit} "
                                         "is as it was)", host=host.name,
                                         hint=f"`ddtreectl restore-service {host.name}` starts and verifies it")
    result.changing = True
    if checked.stale:
        stale_units.remove_units(transport, host.remote_root, checked.stale, checked.record, host=host.name,
                                 rendered_unit=rendered.unit, enable_instead=options.enable)
        result.units_removed = [u.unit for u in checked.stale]
        result.warnings += [stale_units.removed_note(u, host.name) for u in checked.stale]
    try:
        result.started, since, notes = start_service(transport, host, rendered.unit, enable=options.enable,
                                                     record=result)
    except ServiceStartError as err:
        result.started = False  # a failed enable/start: nothing was started
        err.warnings = result.warnings + err.warnings  # what --force let through, e.g. a drop-in
        err.units_removed = list(result.units_removed)  # done on the host whatever the start did
        raise
    result.warnings.extend(notes)

    def record(event: PhaseEvent) -> None:
        if event.status != "running":
            result.phases.append(event)
        on_event(event)

    if gate:
        result.failure = ServiceGate(transport, host.name, service, rendered.server_args, on_event=record,
                                     journal_since=since if result.started else None, cancel=cancel).run()
    result.duration_s = time.monotonic() - started_at
    interrupted = result.failure.phase if result.failure is not None and result.failure.cancelled else None
    not_audited = append_audit(transport, host.remote_root, "restore-service", unit=rendered.unit,
                               ok=result.ok, started=result.started, enabled=result.enabled,
                               failed_phase=result.failure.phase if result.failure and not interrupted else None,
                               interrupted=interrupted)
    if not_audited:
        result.warnings.append(not_audited)
    if interrupted:
        raise _gate_interrupted(result, host, interrupted)
    return result


def _gate_interrupted(result: RestoreResult, host: Host, phase: str) -> InterruptedByOperatorError:
    """Exit 130 for Ctrl-C during the gate, with the state: the unit was started (or was already
    running), its health unknown: ddtreectl stopped waiting, the server keeps loading."""
    state = "was started" if result.started else "was already running (not restarted)"
    boot = "enabled at boot" if result.enabled else "not enabled at boot: --no-enable"
    return InterruptedByOperatorError(
        f"interrupted while verifying the start ({phase}): {result.unit} {state} ({boot}); its health is unknown "
        "(ddtreectl stopped waiting, the service keeps starting)", host=host.name,
        hint=f"`ddtreectl status {host.name}` says whether it serves yet; `ddtreectl restore-service {host.name}` "
             "verifies it phase by phase")
