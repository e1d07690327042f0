"""`deploy` on one host: lock, sync, build, self-test, units, switch, stamp, audit, prune.

Order matters for safety: nothing a server reads changes before the last steps. The new release is
staged under `releases/.incoming-<id>` and renamed to its final name only once built and tested;
`current` moves last. An interruption at any step (Ctrl-C, a dropped link, a killed ddtreectl)
leaves the host serving its old release; the lock is released in a `finally`, or, when the
process died, stays as an automatic lock whose holder this machine can prove dead (see `take_lock`).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ddtreectl.errors import InterruptedByOperatorError, LockHeldError, RemoteCommandError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations import activate, remote_lock
from ddtreectl.operations.audit import append_audit, operator, remote_path
from ddtreectl.operations.dev_hold import refuse_if_held_for_dev
from ddtreectl.operations.build import build_release, choose_archs, require_built, run_selftest
from ddtreectl.operations.release import ShippedFile, release_id, stamp_good, stamp_text
from ddtreectl.operations.restart import restart_and_verify, restart_error, restart_interrupted
from ddtreectl.operations.sync import copy_local, explain_failed_copy, rsync_argv, run_rsync, shipped_kib, sources_for
from ddtreectl.probes.facts import HostFacts
from ddtreectl.probes.mode_lease import lease_from_state_files
from ddtreectl.probes.status import probe_status
from ddtreectl.transport.base import Transport

if TYPE_CHECKING:
    from ddtreectl.render.units import RenderedService

LOCK_NAME = "deploy"
_PID_IN_REASON = re.compile(r"ddtreectl pid (\d+)")


@dataclass(frozen=True)
class DeployOptions:
    engine_dir: Path
    templates_dir: Path | None
    files: tuple[ShippedFile, ...]  # walked once per command (release.walk_files)
    lock_wait_s: float = 0.0
    lock_ttl_s: int = 3600  # longer than the slowest full build; a dead holder of this machine is taken over at once
    restart: bool = False
    build_timeout_s: float = 3600.0


@dataclass(frozen=True)
class DeployEvent:
    host: str
    phase: str  # probe, lock, sync, build, selftest, units, switch, done
    completed: float | None = None
    total: float | None = None
    detail: str = ""


EventFn = Callable[[DeployEvent], None]


@dataclass
class DeployResult:
    host: str
    release: str
    action: str = "noop"  # "deployed" (built now) | "activated" (built before, switched now) | "noop"
    previous: str | None = None
    archs: str = ""
    archs_source: str = ""
    built: bool = False
    ninja_steps: int | None = None
    compiled: tuple[str, ...] = ()
    selftest: str = ""
    units_changed: tuple[str, ...] = ()
    daemon_reloaded: bool = False
    units_removed: tuple[str, ...] = ()  # units no longer rendered for the host: stopped, disabled, deleted
    stale_running: tuple[str, ...] = ()  # ...still running: left alone without --restart (see stale_units)
    replaced_running: str = ""  # --restart: the running stale unit(s) stopped; the rendered unit starts instead
    restarted: bool = False
    restart_verified: bool = False  # --restart: the restarted service passed restore-service's gate
    restart_note: str = ""  # --restart: why the unit was not restarted or not gated ("" otherwise)
    still_running: str | None = None  # without --restart: the older release the running service still runs
    pruned: tuple[str, ...] = ()
    lock_took_over: str | None = None
    timings: dict[str, float] = field(default_factory=dict)


def _check(cancel: threading.Event | None, host: str) -> None:
    if cancel is not None and cancel.is_set():
        raise InterruptedByOperatorError("interrupted; `current` unchanged", host=host)


def _interrupted(err: InterruptedByOperatorError, transport: Transport, host: Host, stage: str,
                 current: str | None, rid: str | None) -> InterruptedByOperatorError:
    """The interrupt in words the operator can act on: where it stopped, what became of the remote
    command it abandoned (the transport stops it: a build used to compile on until its timeout) and
    which release is current. Only reached before the switch (the cancel checks and the build's and
    self-test's ticks come before it), so `current` is the one the deploy found."""
    stopped = getattr(transport, "last_abandoned", None)
    remote = f" ({stopped})" if stopped and stage in ("build", "selftest") else \
        " (rsync was stopped)" if stage == "sync" else ""
    what = {"build": "the build", "selftest": "the self-test", "sync": "the copy"}.get(stage, stage)
    staged = f"; release {rid} was not activated (its staged copy .incoming-{rid} is left for the next " \
        "deploy to reuse or prune)" if rid and stage in ("sync", "build", "selftest") else ""
    return InterruptedByOperatorError(
        f"interrupted during {what}{remote}; nothing was switched: `current` is still "
        f"{current or 'unset (nothing deployed yet)'}{staged}; the deploy lock was released",
        hint=err.hint, host=host.name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphaned(holder: remote_lock.LockInfo, me: str) -> bool:
    """An automatic lock taken by a ddtreectl of THIS machine and user whose process is gone."""
    m = _PID_IN_REASON.search(holder.reason)
    return holder.kind == "auto" and holder.owner == me and m is not None and not _pid_alive(int(m.group(1)))


def take_lock(transport: Transport, root: str, reason: str, *, wait_s: float, ttl_s: int) -> remote_lock.Acquired:
    """The deploy lock, or LockHeldError (exit 8) with the holder. A lock left by a killed ddtreectl
    of this machine is taken over at once (recorded in the audit log), not waited out for its TTL."""
    try:
        return remote_lock.acquire(transport, root, LOCK_NAME, reason=reason, ttl_s=ttl_s)
    except LockHeldError:
        holder = remote_lock.status(transport, root, LOCK_NAME)
        if holder is not None and orphaned(holder, operator()):
            remote_lock.release(transport, root, LOCK_NAME, force=True)
            append_audit(transport, root, "lock-takeover", lock=LOCK_NAME, holder=holder.owner, reason=holder.reason)
            got = remote_lock.acquire(transport, root, LOCK_NAME, reason=reason, ttl_s=ttl_s)
            return remote_lock.Acquired(got.info, holder)
        if wait_s <= 0:
            raise
        return remote_lock.acquire(transport, root, LOCK_NAME, reason=reason, ttl_s=ttl_s, wait_s=wait_s)


def release_lock_quietly(transport: Transport, root: str) -> None:
    """Best effort (a `finally` on a possibly dead link): the TTL covers a failure here."""
    try:
        remote_lock.release(transport, root, LOCK_NAME)
    except Exception:  # noqa: BLE001 - the lock then expires by its TTL; nothing better to do
        pass


def _audit_quietly(transport: Transport, root: str, action: str, **fields: object) -> None:
    try:
        append_audit(transport, root, action, **fields)
    except Exception:  # noqa: BLE001 - the failure being reported matters more than its audit line
        pass


def probe(transport: Transport, inventory: Inventory, host: Host) -> HostFacts:
    service = inventory.service_of(host)
    return probe_status(transport, unit=service.unit if service else None, remote_root=host.remote_root,
                        timeout=host.command_timeout)


def target_release(facts: HostFacts, host: Host, files: tuple[ShippedFile, ...]) -> tuple[str, str, str]:
    """(release id, archs, where the archs came from) for this host."""
    archs, source = choose_archs(facts.gpus, host.build.cuda_archs)
    settings = {"cuda_archs": archs, "cmake_args": list(host.build.cmake_args)}
    return release_id(files, settings), archs, source


def deploy_host(transport: Transport, inventory: Inventory, host: Host, options: DeployOptions, *,
                on_event: EventFn | None = None, cancel: threading.Event | None = None) -> DeployResult:
    """Deploy the engine to one host (see the module docstring for the order and its guarantees)."""
    stage = ["lock"]

    def emit(event: DeployEvent) -> None:
        stage[0] = event.phase
        if on_event is not None:
            on_event(event)

    root = host.remote_root
    current: str | None = None
    rid: str | None = None
    t0 = time.monotonic()
    # Lock first, then look: facts read before the lock could be stale by the time a waited-for
    # deploy finishes (it may have built this very release).
    emit(DeployEvent(host.name, "lock"))
    got = take_lock(transport, root, f"deploy (ddtreectl pid {os.getpid()})",
                    wait_s=options.lock_wait_s, ttl_s=options.lock_ttl_s)
    result_lock_s = time.monotonic() - t0
    try:
        emit(DeployEvent(host.name, "probe"))
        facts = probe(transport, inventory, host)
        refuse_if_held_for_dev(lease_from_state_files(facts.state_files), host.name, "deploy")  # before a build
        current = facts.release.current
        rid, archs, source = target_release(facts, host, options.files)
        result = DeployResult(host.name, rid, archs=archs, archs_source=source)
        result.lock_took_over = got.took_over.describe() if got.took_over else None
        result.timings["lock"] = result_lock_s
        result.timings["probe"] = time.monotonic() - t0 - result_lock_s
        _check(cancel, host.name)
        rel = facts.release
        good = rid == rel.current and stamp_good(rel.stamp_text, rid)
        if not good and rid in rel.releases:
            good = activate.list_releases(transport, root).good(rid)
        if not good:
            try:
                _stage_build_test(transport, host, facts, rid, archs, options, result, emit, cancel)
            except RemoteCommandError as err:  # a failed build or self-test: on record on the host too
                _audit_quietly(transport, root, "deploy-failed", release=rid, error=err.message.splitlines()[0])
                raise
        _check(cancel, host.name)
        _activate(transport, inventory, host, facts, rid, options, result, emit, cancel)
    except InterruptedByOperatorError as err:
        if stage[0] in ("restart", "verify"):
            raise  # after the switch: restart_interrupted says what was switched and restarted
        raise _interrupted(err, transport, host, stage[0], current, rid) from None
    finally:
        release_lock_quietly(transport, root)
    result.timings["total"] = time.monotonic() - t0
    emit(DeployEvent(host.name, "done", detail="already current" if result.action == "noop" else result.action))
    return result


def _stage_build_test(transport: Transport, host: Host, facts: HostFacts, rid: str, archs: str,
                      options: DeployOptions, result: DeployResult, emit: EventFn,
                      cancel: threading.Event | None) -> None:
    root = host.remote_root
    t = time.monotonic()
    emit(DeployEvent(host.name, "sync", 0, 100))
    transport.run(f"mkdir -p {remote_path(root, 'releases', '.incoming-' + rid)}", timeout=30)
    prev = facts.release.current if facts.release.current in facts.release.releases else None

    def progress(done: int, pct: int) -> None:
        emit(DeployEvent(host.name, "sync", pct, 100, f"{done:,} bytes"))

    def tick() -> None:
        # Called on every output line and at least once a second while the copy, a compile step or
        # the self-test is quiet: raising abandons it (the transport or run_rsync stops it) so an
        # interrupt is prompt and leaves nothing running behind the released lock.
        _check(cancel, host.name)

    if transport.rsync_ssh_command() is None and shutil.which("rsync") is None:
        releases = Path(os.path.expanduser(root)) / "releases"
        copy_local(options.files, options.engine_dir, options.templates_dir, releases / f".incoming-{rid}",
                   releases / prev if prev else None, progress)
    else:
        argv = rsync_argv(transport, sources_for(options.engine_dir, options.templates_dir),
                          f"{root.rstrip('/')}/releases/.incoming-{rid}", link_dest=f"../{prev}" if prev else None)
        try:
            run_rsync(argv, host=host.name, timeout=options.build_timeout_s, on_progress=progress,
                      remote_root=root, on_tick=tick)
        except RemoteCommandError as err:
            need = shipped_kib(options.files, options.engine_dir, options.templates_dir)
            raise explain_failed_copy(err, transport, root, need) from None
    result.timings["sync"] = time.monotonic() - t
    _check(cancel, host.name)

    t = time.monotonic()
    emit(DeployEvent(host.name, "build", 0, None, f"archs {archs or 'engine default'}"))

    def step(n: int, total: int, what: str) -> None:
        emit(DeployEvent(host.name, "build", n, total, what))

    outcome = build_release(transport, root, rid, archs, host.build.cmake_args, timeout=options.build_timeout_s,
                            on_step=step, on_line=lambda _: tick(), on_tick=tick)
    result.timings["build"] = time.monotonic() - t
    require_built(outcome, host.name, root)
    result.built, result.ninja_steps, result.compiled = True, outcome.steps, outcome.compiled

    t = time.monotonic()
    emit(DeployEvent(host.name, "selftest"))
    has_gpu = facts.gpus.status == "ok" and bool(facts.gpus.gpus)
    test = run_selftest(transport, root, rid, has_gpu=has_gpu, expected_gpus=host.gpus,
                        timeout=options.build_timeout_s, on_line=lambda _: tick(), on_tick=tick)
    result.timings["selftest"] = time.monotonic() - t
    result.selftest = test.verdict
    if not test.ok:
        hint = (f"log on the host: {root}/releases/.incoming-{rid}/selftest.log" if has_gpu else
                "check the driver (`nvidia-smi` on the host); if the host has no GPU, set gpus: 0 for it")
        raise RemoteCommandError(f"self-test {test.verdict}; `current` unchanged.\n{test.tail}".rstrip(),
                                 hint=hint, host=host.name)
    stamp = stamp_text(rid, archs=archs or "engine default", selftest=test.verdict, by=operator(),
                       now=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), ninja_steps=outcome.steps)
    activate.finalize(transport, root, rid, stamp)
    result.action = "deployed"


def _stale_units(transport: Transport, host: Host, facts: HostFacts, rendered: RenderedService | None,
                 options: DeployOptions, result: DeployResult) -> None:
    """Remove the units ddtreectl installed that the inventory no longer renders (before a restart:
    the old unit holds the port and GPUs the new one needs). A running one only under --restart: a
    deploy without it never stops a serving process; it is reported instead, with the command."""
    from ddtreectl.operations import stale_units

    remove = [u for u in facts.other_units if options.restart or not u.running]
    kept = [u.unit for u in facts.other_units if u not in remove]
    record = stale_units.record_text(rendered, kept)
    if remove:
        stale_units.remove_units(transport, host.remote_root, remove, record, host=host.name,
                                 rendered_unit=rendered.unit if rendered is not None else None)
        result.units_removed = tuple(u.unit for u in remove)
        result.replaced_running = ", ".join(u.unit for u in remove if u.running)
    elif facts.state_files.get(f"state/{stale_units.RECORD}", "").strip() != record.strip():
        stale_units.write_record(transport, host.remote_root, record, host=host.name)
    result.stale_running = tuple(kept)


def _activate(transport: Transport, inventory: Inventory, host: Host, facts: HostFacts, rid: str,
              options: DeployOptions, result: DeployResult, emit: EventFn,
              cancel: threading.Event | None = None) -> None:
    from ddtreectl.operations.units import drift, install_units, read_installed
    from ddtreectl.render.units import render_service

    root = host.remote_root
    t = time.monotonic()
    emit(DeployEvent(host.name, "units"))
    rendered = render_service(inventory, host)
    if rendered is not None:
        installed = read_installed(transport, rendered)
        if drift(rendered, installed):
            done = install_units(transport, rendered, installed)
            result.units_changed, result.daemon_reloaded = done.changed, done.daemon_reloaded
    _stale_units(transport, host, facts, rendered, options, result)
    if facts.release.current != rid or not facts.release.current_exists:
        emit(DeployEvent(host.name, "switch"))
        result.previous = activate.switch_current(transport, root, rid)
        if result.action == "noop":
            result.action = "activated"
    failed_restart: RemoteCommandError | InterruptedByOperatorError | None = None
    interrupted = ""  # the gate phase (or "before the restart") Ctrl-C stopped the restart in
    if options.restart and rendered is not None:
        emit(DeployEvent(host.name, "restart"))
        outcome = restart_and_verify(transport, inventory, host, replaces=result.replaced_running, cancel=cancel,
                                     on_event=lambda e: emit(
            DeployEvent(host.name, "verify", detail=f"{e.phase}: {e.detail}" if e.detail else e.phase)))
        result.restarted, result.restart_verified = outcome.restarted, outcome.verified
        result.restart_note = outcome.left
        interrupted = outcome.interrupted
        if interrupted:
            failed_restart = restart_interrupted(outcome, host, rendered.unit, rid,
                                                 result.previous or facts.release.running or None,
                                                 switched=f"`current` is {rid}"
                                                 + (f" (was {result.previous})" if result.previous else ""))
        elif not outcome.ok:
            failed_restart = restart_error(outcome, host, rendered.unit, rid,
                                           result.previous or facts.release.running or None,
                                           switched=f"`current` is {rid}")
    elif rendered is not None and facts.service is not None and facts.service.active_state == "active" \
            and facts.release.running and facts.release.running != rid:
        # Said here, not only by a later `status`: the operator who just deployed is the one to act.
        result.still_running = facts.release.running
    result.timings["activate"] = time.monotonic() - t
    # The audit line comes before a failed restart is raised: `current` has moved either way, and
    # the host's record must say so (it used to be skipped, leaving the switch unrecorded).
    append_audit(transport, root, "deploy", release=rid, previous=result.previous, outcome=result.action,
                 selftest=result.selftest or None, restarted=result.restarted,
                 restart_failed=failed_restart.message.splitlines()[0] if failed_restart else None,
                 restart_interrupted=interrupted or None)
    if failed_restart is not None:
        raise failed_restart
    if result.action != "noop":
        result.pruned = tuple(activate.prune(transport, root, host.keep_releases, (rid, result.previous)))
