"""`deploy --plan` and `rollback`: what a deploy would change (read-only), and switching back.

The plan reads, never writes: the status probe, an rsync `--dry-run --itemize-changes` against the
release `current` points to, the units drift, the lock record. Rollback takes the deploy lock and
switches `current` to a release whose build stamp is good.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ddtreectl.errors import LockHeldError, RemoteCommandError, UsageError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations import activate, remote_lock
from ddtreectl.operations.audit import append_audit
from ddtreectl.operations.dev_hold import read_lease, refuse_if_held_for_dev
from ddtreectl.operations.deploy import (
    LOCK_NAME,
    DeployOptions,
    probe,
    release_lock_quietly,
    take_lock,
    target_release,
)
from ddtreectl.operations.release import stamp_good
from ddtreectl.operations.restart import restart_and_verify, restart_error, restart_interrupted, running_release
from ddtreectl.operations.service_gate import PhaseEvent
from ddtreectl.operations.sync import FileChanges, parse_itemize, rsync_argv, run_rsync, sources_for
from ddtreectl.probes.facts import GpuState
from ddtreectl.probes.mode_lease import lease_from_state_files
from ddtreectl.transport.base import Transport


@dataclass
class PlanResult:
    host: str
    release: str
    current: str | None
    archs: str
    archs_source: str
    build_needed: bool
    switch_needed: bool
    files: FileChanges
    units: list[str] = field(default_factory=list)  # drift descriptions
    unit_diffs: list[str] = field(default_factory=list)
    stale_units: list[str] = field(default_factory=list)  # units no longer rendered, and what deploy does to them
    lock: str | None = None  # holder description
    gpus: str = ""
    refused: str | None = None  # why the deploy itself would be refused (exit 8: held for development)


def gpu_summary(gpus: GpuState) -> str:
    """One line on the host's GPUs for the plan: count, archs and whether any is busy."""
    if gpus.status != "ok" or not gpus.gpus:
        return {"missing": "no GPU (nvidia-smi not installed)", "no-devices": "no GPU (no devices found)"}.get(
            gpus.status, f"no GPU answered ({gpus.status}{': ' + gpus.detail if gpus.detail else ''})")
    caps = sorted({g.compute_cap or "?" for g in gpus.gpus})
    busy = [g for g in gpus.gpus if gpus.busy(g)]
    state = f"{len(busy)} busy" if busy else "idle"
    return f"{len(gpus.gpus)} GPU(s), compute capability {', '.join(caps)}, {state}"


def plan_host(transport: Transport, inventory: Inventory, host: Host, options: DeployOptions) -> PlanResult:
    """What `deploy` would do on this host; changes nothing."""
    from ddtreectl.operations.units import drift, read_installed
    from ddtreectl.render.units import render_service

    root = host.remote_root
    facts = probe(transport, inventory, host)
    rid, archs, source = target_release(facts, host, options.files)
    rel = facts.release
    good = rid == rel.current and stamp_good(rel.stamp_text, rid)
    if not good and rid in rel.releases:
        good = activate.list_releases(transport, root).good(rid)
    if rel.current and rel.current in rel.releases and rel.current != rid:
        argv = rsync_argv(transport, sources_for(options.engine_dir, options.templates_dir),
                          f"{root.rstrip('/')}/releases/{rel.current}", dry_run=True, checksum=True)
        files = parse_itemize(run_rsync(argv, host=host.name, timeout=600).stdout)
    elif rel.current == rid:
        files = FileChanges()
    else:
        files = FileChanges(added=tuple(f.path for f in options.files))
    plan = PlanResult(host.name, rid, rel.current, archs, source, build_needed=not good,
                      switch_needed=rel.current != rid, files=files, gpus=gpu_summary(facts.gpus))
    rendered = render_service(inventory, host)
    if rendered is not None:
        for d in drift(rendered, read_installed(transport, rendered)):
            plan.units.append(d.describe())
            if d.diff:
                plan.unit_diffs.append(d.diff)
    for unit in facts.other_units:
        plan.stale_units.append(
            f"{unit.unit} ({unit.active}, {unit.enabled}) is no longer rendered for {host.name}: "
            + ("deploy would stop, disable and remove it" if options.restart or not unit.running else
               f"still running; deploy leaves it running and says so, `ddtreectl deploy {host.name} --restart` "
               "stops, disables and removes it"))
    holder = remote_lock.status(transport, root, LOCK_NAME)
    plan.lock = holder.describe(int(time.time())) if holder else None
    try:
        refuse_if_held_for_dev(lease_from_state_files(facts.state_files), host.name, "deploy")
    except LockHeldError as held:
        plan.refused = f"{held.message} (exit {int(held.exit_code)}); hint: {held.hint}"
    return plan


@dataclass(frozen=True)
class RollbackResult:
    host: str
    release: str
    previous: str | None
    restarted: bool
    restart_verified: bool = False  # --restart: the restarted service passed restore-service's gate
    restart_note: str = ""  # --restart: why the unit was not restarted or not gated ("" otherwise)
    # Without --restart: the release the running service still runs (restart pending), else None.
    still_running: str | None = None


def rollback_host(transport: Transport, inventory: Inventory, host: Host, *, to: str | None, lock_wait_s: float,
                  restart: bool, on_event: Callable[[PhaseEvent], None] = lambda event: None,
                  cancel: threading.Event | None = None) -> RollbackResult:
    """Switch `current` back to the recorded previous release (or `to`); it must have a good stamp.
    `cancel` (Ctrl-C) stops the restart's health gate from waiting (exit 130, the state said)."""
    root = host.remote_root
    take_lock(transport, root, f"rollback (ddtreectl pid {os.getpid()})", wait_s=lock_wait_s, ttl_s=600)
    try:
        refuse_if_held_for_dev(read_lease(transport, root), host.name, "rollback")
        listing = activate.list_releases(transport, root)
        target = to or listing.previous
        if target is None or target == listing.current or not listing.good(target):
            candidates = sorted((r for r in listing.mtimes if r != listing.current and listing.good(r)),
                                key=lambda r: listing.mtimes[r], reverse=True)
            if to is not None:
                why = "is already current" if to == listing.current else (
                    "does not exist" if to not in listing.mtimes else "has no good build stamp")
                raise UsageError(f"release {to} {why}", host=host.name,
                                 hint="good releases: " + (", ".join(candidates) or "none"))
            if not candidates:
                only = f" (only {listing.current} is deployed)" if listing.current else ""
                raise RemoteCommandError(f"no earlier release with a good build stamp to roll back to{only}",
                                         host=host.name, hint="nothing to roll back to: deploy the release you want"
                                         if listing.current else "no release is deployed: deploy one first")
            target = candidates[0]
        old = activate.switch_current(transport, root, target)
        outcome = restart_and_verify(transport, inventory, host, on_event=on_event,
                                     cancel=cancel) if restart else None
        restarted = outcome is not None and outcome.restarted
        failure = outcome.failure if outcome is not None else ""
        interrupted = outcome.interrupted if outcome is not None else ""
        append_audit(transport, root, "rollback", release=target, previous=old, restarted=restarted,
                     restart_failed=failure or None, restart_interrupted=interrupted or None)
        service = inventory.service_of(host)
        if outcome is not None and interrupted:
            raise restart_interrupted(outcome, host, service.unit if service else "the service", target, old,
                                      switched=f"rolled back to {target} (was {old or 'none'})")
        if outcome is not None and failure:
            raise restart_error(outcome, host, service.unit if service else "the service", target, old,
                                switched=f"rolled back to {target} (was {old or 'none'})")
        # Without --restart a running service keeps the release it was started from: said here, as
        # deploy does, so a rollback of a bad release is not taken for a fix while the bad one serves.
        running = running_release(transport, host, service.unit) if service and not restart else None
        return RollbackResult(host.name, target, old, restarted,
                              restart_verified=outcome is not None and outcome.verified,
                              restart_note=outcome.left if outcome is not None else "",
                              still_running=running if running and running != target else None)
    finally:
        release_lock_quietly(transport, root)

