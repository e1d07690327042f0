"""Switch a host between production serving and development, with a lease on the host.

`<remote_root>/state/mode.json` (written atomically: temp file + rename) says which mode the host is
in and, in development, who holds it, why and until when. Every switch runs under the named host
lock "mode" (operations/remote_lock.py), so two operators racing for the same host get one winner
and one LockHeldError (exit 8) naming the winner. Every switch is an audit line on the host.

to dev:  drain (metrics) -> disable + stop the serving unit -> GPUs verified idle -> lease written.
to prod: refuse while development processes hold GPUs -> restore through restore_host (the same
         preflight and phased health gate as `restore-service`) -> lease cleared (mode prod) once
         the unit was started, also when the gate then fails (exit 5, the state and next step said).
         A `systemctl start` that fails (nothing started) disables the unit again and keeps the lease;
         one that timed out is first judged by the unit's real state (restore.start_service).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ddtreectl.errors import (
    DdtreeError,
    GpusBusyError,
    InterruptedByOperatorError,
    LockHeldError,
    RemoteCommandError,
    ServiceStartError,
)
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations import remote_lock
from ddtreectl.operations.audit import append_audit, operator, remote_path
from ddtreectl.operations.drain import DrainResult, drain, reading_steps
from ddtreectl.operations.mode_settle import Settled, next_step, settle, undo_enable
from ddtreectl.operations.gpus import SampleOptions, check_gpus, wait_idle
from ddtreectl.operations.restore import RestoreOptions, RestoreResult, restore_host
from ddtreectl.operations.service_gate import PhaseEvent
from ddtreectl.probes.gpu_verdict import HostVerdict
from ddtreectl.probes.mode_lease import LEASE_PATH, ModeLease, parse_lease
from ddtreectl.transport.base import Transport

LOCK_NAME = "mode"
_LEASE_MARK = "@@ddtree-lease"


@dataclass(frozen=True)
class HostMode:
    """The lease as read from the host, with the host's clock at that moment."""

    lease: ModeLease | None  # None: no mode.json (never switched: production)
    now: int
    current_exists: bool  # <root>/current resolves to a directory

    @property
    def mode(self) -> str:
        return "prod" if self.lease is None else self.lease.mode


@dataclass
class SwitchResult:
    host: str
    to: str
    lease: ModeLease | None = None
    drain: DrainResult | None = None
    stopped: bool = False
    verdict: HostVerdict | None = None
    restore: RestoreResult | None = None
    forced: list[str] = field(default_factory=list)  # what --force overrode, in words
    warnings: list[str] = field(default_factory=list)
    # `systemctl start` failed (nothing started): its error, the unit and what was put back.
    start_failure: str | None = None
    unit: str | None = None
    put_back: str | None = None
    units_removed: list[str] = field(default_factory=list)  # removed by a restore that then failed or broke off
    lease_kept: bool = False  # `lease` is the development lease still in force, not one written
    broken_off: str | None = None  # mode prod broken off past its preflight: how it was settled (mode_settle)

    @property
    def ok(self) -> bool:
        return self.start_failure is None and (self.restore is None or self.restore.ok)

    def failure_error(self) -> RemoteCommandError | None:
        """The error a failed health gate ends the switch to prod with: what failed, the state the
        host is left in (production, the lease ended) and the next step."""
        if self.start_failure is not None:
            holder = self.lease.holder if self.lease else None
            kept = f"the development lease of {holder} is kept" if holder else "the lease is unchanged"
            return RemoteCommandError(
                f"{self.start_failure}; nothing was started and the host stays in development mode "
                f"({self.put_back}; {kept})",
                hint=f"`ddtreectl logs {self.host}` and `systemctl status {self.unit}` on the host show why "
                     f"(a drop-in or dependency that refuses the start); once fixed, `ddtreectl mode {self.host} "
                     "prod` again",
                host=self.host)
        restore = self.restore
        if restore is None or restore.failure is None:
            return None
        f = restore.failure
        return RemoteCommandError(
            f"{restore.unit} failed in phase '{f.phase}' after {f.elapsed_s:.1f} s: {f.reason}; the host is in "
            f"production mode now ({restore.unit} is enabled and was started; the development lease has ended)",
            hint=f"`ddtreectl logs {self.host}` shows why; once fixed, `ddtreectl restore-service {self.host}` "
                 f"starts and verifies it again (or take the host back: `ddtreectl mode {self.host} dev --reason ...`)",
            host=self.host)


def read_mode(transport: Transport, root: str) -> HostMode:
    """Read mode.json, the host clock and whether `current` exists (one round trip)."""
    lease_file = remote_path(root, *LEASE_PATH.split("/"))
    current = remote_path(root, "current")
    result = transport.run(
        f"echo now=$(date +%s); if [ -d {current}/ ]; then echo current=1; else echo current=0; fi; "
        f"echo {_LEASE_MARK}; cat {lease_file} 2>/dev/null || true", timeout=30)
    head, _, body = result.stdout.partition(_LEASE_MARK + "\n")
    values = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
    try:
        now = int(values.get("now", ""))
    except ValueError:
        raise RemoteCommandError(f"reading {LEASE_PATH} failed (exit {result.exit_code}): "
                                 f"{result.stderr.strip()[-200:] or result.stdout.strip()[-200:]}",
                                 host=transport.host_name) from None
    return HostMode(parse_lease(body), now, values.get("current") == "1")


def host_now(transport: Transport) -> int:
    """The host's clock (leases are judged by it, whatever the operator's clock says)."""
    text = transport.run("date +%s", timeout=15).stdout.strip()
    try:
        return int(text)
    except ValueError:
        raise RemoteCommandError(f"`date +%s` printed {text[:80]!r}", host=transport.host_name) from None


def write_lease(transport: Transport, root: str, record: dict[str, object]) -> ModeLease:
    """Replace mode.json atomically (temp file + rename in the same directory)."""
    state = remote_path(root, "state")
    final = remote_path(root, *LEASE_PATH.split("/"))
    tmp = remote_path(root, "state", "mode.json.tmp") + "$$"
    text = json.dumps(record)
    result = transport.run(f"mkdir -p {state} && printf '%s\\n' {shlex.quote(text)} > {tmp} && mv -f {tmp} {final}",
                           timeout=30)
    if not result.ok:
        raise RemoteCommandError(f"writing {root}/{LEASE_PATH} failed: {result.stderr.strip()[-300:]}",
                                 hint="check the disk and permissions under the remote root",
                                 host=transport.host_name)
    lease = parse_lease(text)
    assert lease is not None
    return lease


def _held_by_other(state: HostMode, me: str) -> ModeLease | None:
    lease = state.lease
    if lease is None or lease.mode == "prod" or lease.holder == me:
        return None
    return lease


def _lock(transport: Transport, host: Host, reason: str, ttl_s: int, me: str) -> None:
    """Take the switch lock; a concurrent switch is reported with its holder (exit 8), never waited on."""
    try:
        remote_lock.acquire(transport, host.remote_root, LOCK_NAME, reason=reason, ttl_s=ttl_s, owner=me)
    except LockHeldError as held:
        raise LockHeldError(f"another mode switch is in progress: {held.message}",
                            hint=f"let it finish, then `ddtreectl mode {host.name}` shows who holds the host",
                            host=host.name) from None


def _stop_service(transport: Transport, unit: str, stop_timeout: int) -> None:
    """Disable then stop: a reboot during the development session must not bring production back."""
    u = shlex.quote(unit)
    result = transport.run(f"systemctl disable --quiet -- {u} && systemctl stop -- {u}",
                           timeout=stop_timeout + 60)
    if not result.ok:
        raise RemoteCommandError(f"stopping {unit} failed (exit {result.exit_code}): {result.stderr.strip()[-300:]}",
                                 hint="ddtreectl logs HOST shows why", host=transport.host_name)


def _refuse_unverifiable_gpus(transport: Transport, inventory: Inventory, host: Host, sample: SampleOptions,
                              active: str | None, force: bool, on_step: Callable[[str], None]) -> None:
    """Before anything is stopped: refuse when the idle check that ends the switch can never pass.

    Stopping the service cannot install nvidia-smi: on a host without it the switch used to drain and
    stop production, then refuse (GPUs unknown), leaving the host down with no lease. One quick sample
    (one nvidia-smi query) decides it first; with --force the switch goes on and the final check
    records the override. The same for GPUs nvidia-smi lists in another number than the inventory
    declares (`gpus: 0` included: such a host has GPUs after all). A host declared GPU-less needs no
    nvidia-smi, but it is queried all the same (a GPU the inventory does not know of), and said."""
    if force:
        return
    service = inventory.service_of(host)
    before = "before production is touched" if service else "before anything is changed"
    on_step(f"checking, {before}, that the GPUs can be verified idle: one nvidia-smi query" if host.gpus else
            f"checking, {before}, that the host has no GPUs, as the inventory says (gpus: 0): one nvidia-smi query")
    quick = SampleOptions(samples=1, interval_s=0.0, gpu_timeout_s=sample.gpu_timeout_s)
    verdict = check_gpus(transport, inventory, host, quick)
    unreadable = verdict.nvidia_smi_missing and not verdict.no_gpus
    # Busy now is expected (the service runs): the wait after the stop decides. These two never pass.
    if not unreadable and not verdict.miscount:
        return
    why = "; ".join([r for r in verdict.reasons if r.startswith("GPU state unknown")] if unreadable
                    else [verdict.miscount])
    # "so production was not stopped" read oddly on a host that runs no production (a bench box).
    message = (f"cannot take the host for development: its GPUs can never be verified idle ({why}), so production "
               f"was not stopped; nothing was changed ({service.unit} is still {active or 'unknown'})" if service else
               f"cannot take the host for development: one nvidia-smi query shows its GPUs can never be verified "
               f"idle ({why}); nothing was changed: no lease was written ({host.name} runs no service profile)")
    raise GpusBusyError(
        message,
        hint=(f"install nvidia-smi on {host.name} (or put it on the SSH user's PATH; `ddtreectl gpus "
              f"{host.name}` shows what the sampler sees)" if unreadable else
              f"check {host.name}'s GPUs (one off the bus? another machine?) or correct hosts.{host.name}.gpus "
              f"in {inventory.path.name}")
        + ", or --force to take the host without the GPU check (recorded in the audit log)",
        host=host.name)


def _interrupted_after_stop(transport: Transport, host: Host, touched: str, reason: str,
                            result: SwitchResult) -> InterruptedByOperatorError:
    """Ctrl-C once production was disabled/stopped but before the lease: the host is out of production
    and nobody holds it. It used to end with no word at all (exit 130), and `status` then showed a
    stopped, disabled service in "mode prod". Say so, audit it, and name both ways out."""
    try:
        append_audit(transport, host.remote_root, "mode", to="dev", ok=False, interrupted=True, reason=reason,
                     stopped=result.stopped, drain=result.drain.to_json() if result.drain else None)
    except (DdtreeError, KeyboardInterrupt):  # best effort: a second Ctrl-C or a dead link must not hide the state
        pass
    return InterruptedByOperatorError(
        f"interrupted after {touched} (disabled: a reboot will not start it), before the development lease "
        "was written: the host is out of production and nobody holds it",
        hint=f"`ddtreectl mode {host.name} prod` brings production back; `ddtreectl mode {host.name} dev "
             "--reason '…'` takes the host",
        host=host.name)


def switch_to_dev(transport: Transport, inventory: Inventory, host: Host, *, reason: str, ttl_s: int,
                  drain_timeout_s: float, idle_timeout_s: float, force: bool = False,
                  sample: SampleOptions = SampleOptions(),
                  on_step: Callable[[str], None] = lambda text: None,
                  result: SwitchResult | None = None) -> SwitchResult:
    """Take the host for development: drain, stop, verify idle GPUs, record the lease. `result`, when
    given, is filled in as the switch goes, so a caller still has what was done when it raises."""
    me = operator()
    root = host.remote_root
    service = inventory.service_of(host)
    lock_ttl = int(drain_timeout_s + idle_timeout_s + (service.stop_timeout if service else 0) + 600)
    _lock(transport, host, f"mode dev: {reason}", lock_ttl, me)
    try:
        result = result if result is not None else SwitchResult(host.name, "dev")
        state = read_mode(transport, root)
        other = _held_by_other(state, me)
        if other is not None:
            if not force:
                expired = other.expired(state.now)
                raise LockHeldError(
                    other.describe(state.now),
                    hint=("an expired lease is never taken over silently: " if expired else "")
                    + f"ask {other.holder}, or --force to take it over (recorded in the audit log)",
                    host=host.name)
            result.forced.append(f"took over the lease of {other.holder}")
        mine = state.lease
        if mine is not None and mine.mode == "dev" and mine.holder == me:
            # A renewal (new reason or expiry, expired or not): the host is already out of production
            # and the holder's own processes may be on the GPUs, so nothing is stopped or checked.
            return _renew(transport, root, result, mine, reason, ttl_s)
        active = None
        if service is not None:
            active = transport.run(f"systemctl is-active -- {shlex.quote(service.unit)}", timeout=15).stdout.strip()
        _refuse_unverifiable_gpus(transport, inventory, host, sample, active, force, on_step)
        if service is not None:
            if active in ("active", "activating", "reloading"):
                on_step(f"draining {service.unit} (up to {drain_timeout_s:g} s)")
                result.drain = drain(transport, service.port, timeout_s=drain_timeout_s,
                                     on_reading=reading_steps(on_step))
                on_step(result.drain.note)
                if not result.drain.drained:
                    result.warnings.append(f"drain: {result.drain.note}; stopped anyway")
            result.stopped = active not in ("inactive", "failed", "unknown")
            touched = f"{service.unit} was disabled and stopped" if result.stopped else f"{service.unit} was disabled"
            try:
                if result.stopped:
                    on_step(f"stopping {service.unit}")
                    _stop_service(transport, service.unit, service.stop_timeout)
                else:  # already down (or never installed): only make sure a reboot does not start it
                    transport.run(f"systemctl disable --quiet -- {shlex.quote(service.unit)} 2>/dev/null || true",
                                  timeout=host.command_timeout)
                on_step("verifying the GPUs went idle")
                check = wait_idle(transport, inventory, host, sample, timeout_s=idle_timeout_s)
            except KeyboardInterrupt:
                raise _interrupted_after_stop(transport, host, touched, reason, result) from None
        else:
            on_step("verifying the GPUs went idle")
            check = wait_idle(transport, inventory, host, sample, timeout_s=idle_timeout_s)
        result.verdict = check.verdict
        if not check.verdict.idle:
            head = f"GPUs {check.verdict.verdict} after {check.waited_s:.0f} s: "
            words, said = head + "; ".join(check.verdict.reasons), head + _first_reasons(check.verdict.reasons, host.name)
            if not force:
                append_audit(transport, root, "mode", to="dev", ok=False, reason=reason, stopped=result.stopped,
                             drain=result.drain.to_json() if result.drain else None, gpus=check.verdict.verdict,
                             gpu_reasons=list(check.verdict.reasons))
                stopped = f" ({service.unit} is stopped and disabled; `ddtreectl mode {host.name} prod` " \
                          "restores it)" if service else ""
                raise GpusBusyError(said + stopped, hint="find the holders with `ddtreectl gpus "
                                    f"{host.name}`, or --force to take the host anyway", host=host.name)
            result.forced.append(words)
        now = host_now(transport)  # the lease starts once the host is really free, not when we asked
        record: dict[str, object] = {
            "mode": "dev", "holder": me, "reason": reason, "since": now, "expires": now + ttl_s,
            "ttl_s": ttl_s, "unit": service.unit if service else None, "forced": bool(result.forced)}
        result.lease = write_lease(transport, root, record)
        not_audited = append_audit(
            transport, root, "mode", to="dev", reason=reason, expires=record["expires"],
            previous=state.mode, previous_holder=state.lease.holder if state.lease else None,
            drain=result.drain.to_json() if result.drain else None, stopped=result.stopped,
            gpus=check.verdict.verdict, forced=result.forced or None)
        if not_audited:
            result.warnings.append(not_audited)
        return result
    finally:
        remote_lock.release(transport, root, LOCK_NAME, owner=me)


_REASONS_SAID = 4


def _first_reasons(reasons: Sequence[str], host_name: str) -> str:
    """The refusal's reasons, the first few: a busy 8-GPU host has four per GPU (process, memory,
    utilization, ...), and all of them made one error line of 2,000 characters. `gpus HOST` lists
    every one, and --json (`gpus.reasons`) and the audit line keep them all."""
    if len(reasons) <= _REASONS_SAID:
        return "; ".join(reasons)
    return ("; ".join(reasons[:_REASONS_SAID])
            + f"; and {len(reasons) - _REASONS_SAID} more (`ddtreectl gpus {host_name}` lists them)")


def _renew(transport: Transport, root: str, result: SwitchResult, lease: ModeLease, reason: str,
           ttl_s: int) -> SwitchResult:
    now = host_now(transport)
    result.lease = write_lease(transport, root, {
        "mode": "dev", "holder": lease.holder, "reason": reason, "since": lease.since, "expires": now + ttl_s,
        "ttl_s": ttl_s, "unit": lease.unit, "forced": lease.forced})
    not_audited = append_audit(transport, root, "mode", to="dev", renewed=True, reason=reason,
                               expires=now + ttl_s, previous_expires=lease.expires)
    if not_audited:
        result.warnings.append(not_audited)
    return result


def switch_to_prod(transport: Transport, inventory: Inventory, host: Host, *, force: bool = False,
                   sample: SampleOptions = SampleOptions(),
                   on_step: Callable[[str], None] = lambda text: None,
                   on_event: Callable[[PhaseEvent], None] = lambda event: None,
                   result: SwitchResult | None = None) -> SwitchResult:
    """Give the host back to production: no development process may hold a GPU (unless --force),
    then restore_host's preflight + start + phased gate. The lease says prod once the service was
    started, also when its gate then failed (result.ok False); a refused preflight keeps it.
    `result` as for switch_to_dev."""
    me = operator()
    root = host.remote_root
    service = inventory.service_of(host)
    lock_ttl = int((service.health.total_timeout if service else 0) + 600)
    _lock(transport, host, "mode prod", lock_ttl, me)
    try:
        result = result if result is not None else SwitchResult(host.name, "prod")
        state = read_mode(transport, root)
        other = _held_by_other(state, me)
        if other is not None and not other.expired(state.now):
            if not force:
                raise LockHeldError(other.describe(state.now),
                                    hint=f"ask {other.holder}, or --force (recorded in the audit log)",
                                    host=host.name)
            result.forced.append(f"ended the live lease of {other.holder}")
        on_step("checking that no development process holds a GPU")
        verdict = check_gpus(transport, inventory, host, sample)
        result.verdict = verdict
        foreign = [p.describe() for p in verdict.foreign_processes()]
        dev_units = [r for r in verdict.reasons if r.startswith("development unit")]
        if foreign or dev_units:
            words = "development processes hold GPUs: " + "; ".join(foreign + dev_units)
            if not force:
                raise GpusBusyError(words, hint="stop them (see `ddtreectl gpus "
                                    f"{host.name}`), or --force (recorded in the audit log)", host=host.name)
            result.forced.append(words)
        if service is not None:
            on_step(f"restoring {service.unit} through the restore-service gate")
            # A refusal (no built release, drifted unit, ...) raises here: nothing was started and
            # the development lease stays, which is then still the truth.
            options = RestoreOptions(enable=True, force=force, respect_lease=False)  # the lease is ours here
            u = shlex.quote(service.unit)
            was_enabled = transport.run(f"systemctl is-enabled --quiet -- {u}", timeout=15).ok
            record = RestoreResult(host=host.name, unit=service.unit)
            try:
                result.restore = restore_host(transport, inventory, host, options, on_event=on_event, result=record)
            except ServiceStartError as err:
                return _start_failed(transport, host, result, state, service.unit, err, was_enabled)
            except (DdtreeError, KeyboardInterrupt) as err:
                # Ended half way (Ctrl-C / SIGTERM, a start that timed out with its state unreadable,
                # a dropped connection): what the restore changed stays in the switch document, and
                # past the preflight the host is settled: finished or rolled back, never half-changed.
                result.units_removed = list(record.units_removed)
                result.warnings.extend(record.warnings)
                if not record.changing and not isinstance(err, KeyboardInterrupt):
                    raise  # a refused preflight: nothing was changed, the lease is kept and true
                raise _broken_off(transport, host, result, state, service.unit, was_enabled, err) from None
            result.warnings.extend(result.restore.warnings)
        # Past this point the unit is enabled and started, healthy or not: the host is production's
        # now (systemd may keep restarting a failing service on those GPUs), so the development lease
        # ends even when the gate failed; `run` is then refused and the next step is a repair plus
        # `restore-service`, not a second holder's --force. The failure is in the output and audit log.
        result.lease = write_lease(transport, root, {
            "mode": "prod", "holder": me, "since": state.now, "forced": bool(result.forced),
            "previous_holder": state.lease.holder if state.lease else None})
        failure = result.restore.failure if result.restore else None
        not_audited = append_audit(
            transport, root, "mode", to="prod", ok=result.ok, previous=state.mode,
            previous_holder=state.lease.holder if state.lease else None,
            previous_expired=state.lease.expired(state.now) if state.lease else None,
            failed_phase=failure.phase if failure else None, forced=result.forced or None)
        if not_audited:
            result.warnings.append(not_audited)
        return result
    finally:
        remote_lock.release(transport, root, LOCK_NAME, owner=me)



def _broken_off(transport: Transport, host: Host, result: SwitchResult, state: HostMode, unit: str,
                was_enabled: bool, err: BaseException) -> DdtreeError:
    """Settle a switch to prod broken off after the preflight (operations/mode_settle.py) and return
    the error that says which way: finished (the start took: the lease ends, as after a failed gate)
    or rolled back (an enable undone, the lease kept), or unknown."""
    holder = state.lease.holder if state.lease else None
    settled = settle(transport, host, unit, was_enabled=was_enabled, holder=holder)
    me = operator()
    try:
        if settled.outcome == "finished":
            try:
                result.lease = write_lease(transport, host.remote_root, {
                    "mode": "prod", "holder": me, "since": state.now, "forced": bool(result.forced),
                    "previous_holder": holder})
            except (DdtreeError, KeyboardInterrupt) as unwritten:  # the words must not claim the lease ended
                why = getattr(unwritten, "message", None) or type(unwritten).__name__
                settled = Settled("unknown", f"{unit} had been started, but ending the development lease "
                                             f"failed ({why}): the lease of {holder} is still recorded")
        elif settled.outcome == "rolled back":
            result.lease, result.lease_kept = state.lease, True
        if settled.outcome != "unknown":
            append_audit(transport, host.remote_root, "mode", to="prod", ok=False, previous=state.mode,
                         previous_holder=holder, interrupted=isinstance(err, KeyboardInterrupt),
                         broken_off=settled.outcome, forced=result.forced or None,
                         units_removed=result.units_removed or None)
    except (DdtreeError, KeyboardInterrupt):  # best effort: the settled words still say the truth so far
        pass
    result.put_back, result.broken_off = settled.words, settled.outcome
    if isinstance(err, KeyboardInterrupt):
        return InterruptedByOperatorError(f"interrupted: {settled.words}", hint=next_step(settled, host.name),
                                          host=host.name)
    assert isinstance(err, DdtreeError)
    err.message = f"{err.message}; {settled.words}"
    err.hint = next_step(settled, host.name)
    return err


def _start_failed(transport: Transport, host: Host, result: SwitchResult, state: HostMode, unit: str,
                  err: ServiceStartError, was_enabled: bool) -> SwitchResult:
    """`systemctl start` failed after the enable: nothing runs, so the host is still the development
    holder's. The enable is put back (disabled, as `mode dev` left it): an enabled unit under a dev
    lease would start production on the holder's GPUs at the next reboot. The lease stays."""
    result.start_failure, result.unit = err.message, unit
    result.warnings.extend(err.warnings)
    result.units_removed = list(err.units_removed)
    u = shlex.quote(unit)
    if err.enabled and not was_enabled:
        result.put_back = undo_enable(transport, host, unit)
    else:
        result.put_back = f"{unit} {'enabled' if was_enabled else 'disabled'} as before"
    active = transport.run(f"systemctl is-active -- {u}", timeout=15).stdout.strip()
    result.put_back += f", {active or 'unknown'}"
    result.lease, result.lease_kept = state.lease, True
    not_audited = append_audit(
        transport, host.remote_root, "mode", to="prod", ok=False, previous=state.mode,
        previous_holder=state.lease.holder if state.lease else None, failed_phase="start",
        lease_kept=True, put_back=result.put_back, forced=result.forced or None,
        units_removed=result.units_removed or None)
    if not_audited:
        result.warnings.append(not_audited)
    return result
