"""`deploy --restart` and `rollback --restart`: restart the service on the release `current` now
points to, then verify it through restore-service's phased gate.

Why the gate: a restart proves nothing by itself. The service is `Type=simple`, so `systemctl restart`
returns as soon as the new process is forked; a release whose server crashed on start was reported
as "service restarted" (exit 0) while the unit crash-looped. Now the command passes only once the
unit is active, the port open, /health and readiness answer, the model is listed and /server_info
matches the rendered config; otherwise it fails (exit 5) with the phase, the time and this start's
journal lines.

Which units are restarted: a running one, and one crash-looping between `Restart=` attempts
(activating/auto-restart): that is the very service an operator rolls back to fix, and skipping it
as "not running" left it crash-looping on the release that broke it until systemd's next attempt.
A stopped, disabled or failed (start limit hit) unit is left as it is, as before: `restore-service`
starts it. Of a multi-node service only rank 0 serves HTTP, so other ranks are restarted without
the gate (their rank 0's gate covers them).
"""

from __future__ import annotations

import re
import shlex
import threading
from dataclasses import dataclass
from typing import Callable

from ddtreectl.errors import InterruptedByOperatorError, RemoteCommandError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations.service_gate import PhaseEvent, ServiceGate
from ddtreectl.transport.base import Transport

_JOURNAL_LINES = 12  # enough for a Python traceback's last frames and systemd's exit line


@dataclass(frozen=True)
class RestartOutcome:
    restarted: bool  # `systemctl restart` was run and succeeded
    verified: bool = False  # the gate passed
    left: str = ""  # why the unit was not restarted, or not gated ("" when restarted and verified)
    failure: str = ""  # the failed restart or gate phase ("" when none)
    journal: str = ""  # this start's journal lines when the gate failed
    # Ctrl-C stopped it: "" (not interrupted), "before the restart" (nothing restarted), or the gate
    # phase it stopped waiting in (restarted, health unknown).
    interrupted: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure and not self.interrupted


def restart_and_verify(transport: Transport, inventory: Inventory, host: Host, *,
                       on_event: Callable[[PhaseEvent], None] = lambda event: None,
                       replaces: str = "", cancel: threading.Event | None = None) -> RestartOutcome:
    """Restart the host's service unit if it runs (or crash-loops), then gate it. Never raises for a
    failed restart or gate: the caller records the switch in the audit log first (`current` has
    moved either way), then raises `restart_error`. `replaces`: a running unit of an older name that
    deploy just stopped for this one (stale_units): the unit is started even if it was stopped.
    `cancel` (Ctrl-C): set before the restart, nothing is restarted; set during the gate, it stops
    waiting (`interrupted` names the phase; the service keeps starting, its health unknown)."""
    from ddtreectl.render.units import render_service

    service = inventory.service_of(host)
    rendered = render_service(inventory, host)
    if service is None or rendered is None:
        return RestartOutcome(False, left="the host runs no service profile")
    quoted = shlex.quote(rendered.unit)
    out = transport.run(f"date +@%s; systemctl show -p ActiveState -p SubState -- {quoted}", timeout=15).stdout
    first = out.split("\n", 1)[0].strip()
    since = first if re.fullmatch(r"@\d+", first) else None
    props = dict(line.strip().split("=", 1) for line in out.splitlines() if "=" in line)
    active, sub = props.get("ActiveState", ""), props.get("SubState", "")
    if active not in ("active", "activating", "reloading") and sub != "auto-restart" and not replaces:
        return RestartOutcome(False, left=f"{rendered.unit} is not running ({active or 'unknown'}"
                                          f"{'/' + sub if sub else ''}): left as it is; "
                                          f"`ddtreectl restore-service {host.name}` starts it")
    if cancel is not None and cancel.is_set():
        return RestartOutcome(False, interrupted="before the restart")
    # reset-failed first: a crash loop may have used up StartLimitBurst, and systemd would then
    # refuse the restart of the release that is meant to fix it.
    res = transport.run(f"systemctl reset-failed -- {quoted} 2>/dev/null || true; systemctl restart -- {quoted}",
                        timeout=host.command_timeout)
    if not res.ok:
        return RestartOutcome(False, failure=f"systemctl restart {rendered.unit} failed: "
                                             f"{res.stderr.strip()[-300:] or f'exit {res.exit_code}'}")
    if service.nodes and host.name != service.nodes[0]:
        return RestartOutcome(True, left=f"rank {service.nodes.index(host.name)} of a multi-node service: not "
                                         f"gated (rank 0, {service.nodes[0]}, serves HTTP)")
    failure = ServiceGate(transport, host.name, service, rendered.server_args, on_event=on_event,
                          journal_since=since, cancel=cancel).run()
    if failure is None:
        return RestartOutcome(True, verified=True)
    if failure.cancelled:
        return RestartOutcome(True, interrupted=failure.phase)
    return RestartOutcome(True, failure=f"{failure.phase} failed after {failure.elapsed_s:.1f} s: {failure.reason}",
                          journal=failure.journal)


def running_release(transport: Transport, host: Host, unit: str) -> str | None:
    """The release the unit's running main process was started from (its exe/cwd resolve `current` at
    exec time, as status reads it), or None when it does not run or runs from elsewhere."""
    from ddtreectl.probes.parse import parse_release

    root = shlex.quote(host.remote_root)
    script = (f"root={root}; case $root in \"~/\"*) root=\"$HOME/${{root#\"~/\"}}\" ;; esac; echo \"root=$root\"; "
              f"pid=$(systemctl show -p MainPID --value -- {shlex.quote(unit)} 2>/dev/null); "
              "case $pid in ''|0|*[!0-9]*) ;; *) echo \"main_exe=$(readlink /proc/$pid/exe)\"; "
              "echo \"main_cwd=$(readlink /proc/$pid/cwd)\" ;; esac")
    result = transport.run(script, timeout=15)
    return parse_release(result.stdout).running if result.ok else None


def restart_interrupted(outcome: RestartOutcome, host: Host, unit: str, release: str, previous: str | None, *,
                        switched: str) -> InterruptedByOperatorError:
    """Exit 130 for a restart broken off by Ctrl-C, saying the state the host is in: `current` has
    moved (`switched`), and the unit was either not restarted (it still runs its old release) or
    restarted with its health unknown (the gate stopped waiting; the server keeps loading)."""
    back = (f"; `ddtreectl rollback --host {host.name} --to {previous} --restart` goes back to {previous}"
            if previous and previous != release else "")
    if not outcome.restarted:
        return InterruptedByOperatorError(
            f"interrupted before the restart: {switched}; {unit} was not restarted (it runs the release it "
            "ran before: restart pending); the lock was released", host=host.name,
            hint=f"`systemctl restart {unit}` on the host, then `ddtreectl restore-service {host.name}` "
                 f"verifies it{back}")
    return InterruptedByOperatorError(
        f"interrupted while verifying the restart ({outcome.interrupted}): {switched}; {unit} was restarted "
        "on it; its health is unknown (ddtreectl stopped waiting, the service keeps starting); the lock was "
        "released", host=host.name,
        hint=f"`ddtreectl status {host.name}` says whether it serves yet; `ddtreectl restore-service "
             f"{host.name}` verifies it phase by phase{back}")


def restart_error(outcome: RestartOutcome, host: Host, unit: str, release: str, previous: str | None, *,
                  switched: str) -> RemoteCommandError:
    """The exit-5 error for a failed restart or gate; `switched` says what already happened to
    `current` (it points to `release` now), e.g. "rolled back to X (was Y)"."""
    lines = [line for line in outcome.journal.strip().splitlines() if line.strip()][-_JOURNAL_LINES:]
    journal = ("\nlast journal lines of this start:\n" + "\n".join(lines)) if lines else ""
    if outcome.restarted:
        what = f"{switched}; {unit} was restarted on it but is not healthy: {outcome.failure}"
    else:
        what = f"{switched}, but {outcome.failure}"
    back = (f"`ddtreectl rollback --host {host.name} --to {previous} --restart` goes back to {previous}; "
            if previous and previous != release else "")
    return RemoteCommandError(what + journal, host=host.name,
                              hint=f"`current` is {release}; {back}`ddtreectl logs {host.name}` shows the journal")
