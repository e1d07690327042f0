"""`status` as an operation: probe every targeted host in parallel under one deadline.

Read-only: it changes nothing on any host. Each host costs one connection and one probe round
trip; a dead host costs its connect timeout once and never delays the others (fleet.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Literal

from ddtreectl.errors import (
    AuthenticationError,
    ConnectError,
    DdtreeError,
    ExitCode,
    HostKeyError,
    IdentityMismatchError,
    fan_out_exit_code,
)
from ddtreectl.fleet import DeadlineExceededError, HostResult, run_on_hosts
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.operations.stale_units import status_warning
from ddtreectl.probes.checks import warnings_for
from ddtreectl.probes.facts import HostFacts
from ddtreectl.probes.status import DEFAULT_GPU_TIMEOUT_S, probe_status

# ok: probed · unreachable: no connection (refused, timed out, auth failed) · refused: the host's
# key or machine identity is not the one pinned for its name · timeout: no answer by the global
# deadline · failed: connected but the probe failed (or a bug).
Outcome = Literal["ok", "unreachable", "refused", "timeout", "failed"]
# reused: an OpenSSH master of an earlier command was there · new: OpenSSH, a master started now
# · paramiko: a connection of its own (reuse off, jump host, unpinned key or a fallback).
Connection = Literal["reused", "new", "paramiko"]


@dataclass(frozen=True)
class HostStatus:
    """One host's answer to `status`, or why there is none."""

    host: Host
    outcome: Outcome
    facts: HostFacts | None = None
    error: str = ""
    hint: str = ""
    connect_ms: float | None = None  # None: the connection is part of probe_ms (OpenSSH path)
    probe_ms: float | None = None  # one probe round trip (on the open connection when connect_ms)
    connection: Connection | None = None  # how we reached it; None for local or no answer
    warnings: tuple[str, ...] = ()
    exception: BaseException | None = None  # kept for --debug tracebacks

    @property
    def answered(self) -> bool:
        return self.outcome == "ok"

    @property
    def reach(self) -> str:
        """The outcome in the table's words. A failed login (user, identity file) is "unreachable" in
        the JSON's outcome, but said as such it sent operators to check a network that was fine."""
        if self.outcome == "unreachable" and isinstance(self.exception, AuthenticationError):
            return "login failed"
        return _REACH_WORDS.get(self.outcome, self.outcome)

    @property
    def exit_code(self) -> int:
        """What `status` exits with when this host alone is targeted: 0 answered; 4 refused,
        unreachable or silent past the deadline (as every single-host command exits on a host it
        cannot reach); 1 a bug in ddtreectl; else the probe's error's own code (5)."""
        if self.outcome == "ok":
            return int(ExitCode.OK)
        if self.outcome in ("refused", "unreachable", "timeout"):
            return int(ExitCode.CONNECTION)
        if isinstance(self.exception, DdtreeError):
            return int(self.exception.exit_code)
        return int(ExitCode.INTERNAL if self.error.startswith("internal error") else ExitCode.REMOTE)


_REACH_WORDS = {"unreachable": "unreachable", "refused": "REFUSED", "timeout": "no answer", "failed": "probe failed"}


@dataclass(frozen=True)
class StatusReport:
    hosts: tuple[HostStatus, ...]
    deadline_s: float
    elapsed_s: float

    def exit_code(self) -> int:
        """0 all answered; 4 any key/identity refusal (needs a human: outranks the rest); 1 if a
        failure was a bug in ddtreectl; else the fan-out rule (errors.fan_out_exit_code): the code
        every host's failure shares (all unreachable: 4), or 6 when some answered."""
        outcomes = [h.outcome for h in self.hosts]
        if "refused" in outcomes:
            return int(ExitCode.CONNECTION)
        failed = [h.exit_code for h in self.hosts if not h.answered]
        if ExitCode.INTERNAL in failed:
            return int(ExitCode.INTERNAL)
        return fan_out_exit_code(failed, len(self.hosts))


@dataclass(frozen=True)
class _Probed:
    facts: HostFacts
    connect_ms: float | None
    probe_ms: float
    connection: Connection | None
    drift: tuple[str, ...] = ()


def unit_drift(inventory: Inventory, host: Host, facts: HostFacts) -> list[str]:
    """Warnings when the installed unit is not what ddtreectl renders for the host: a hand edit (or a
    render from other inventory values), or drop-ins overriding it. `render HOST --diff` shows how."""
    if facts.service is None or facts.service.load_state == "not-found":
        return []
    from ddtreectl.errors import TemplateError
    from ddtreectl.render.units import render_service

    try:
        rendered = render_service(inventory, host)
    except TemplateError as err:
        return [f"cannot render the unit to check for drift: {err.message}"]
    if rendered is None:
        return []
    out = []
    if facts.unit_sha256 is not None and facts.unit_sha256 != rendered.unit_file.sha256:
        out.append(f"{rendered.unit} differs from the rendered unit (hand edit?): "
                   f"ddtreectl render {host.name} --diff")
    out.extend(f"drop-in overrides {rendered.unit}: {path}" for path in facts.unit_dropins)
    return out


def gather_status(inventory: Inventory, hosts: list[Host], *, deadline_s: float,
                  reuse: bool = True) -> StatusReport:
    """Probe `hosts` in parallel; every host gets a HostStatus, whatever happened to it.

    `reuse`: reach SSH hosts through OpenSSH masters kept warm across invocations (transport/
    mux.py); False opens a fresh Paramiko connection per host, as every other command does.
    """
    started = time.monotonic()
    # A hung nvidia-smi must leave time for the rest of the probe (and the connect) in the deadline.
    gpu_timeout = max(1, min(DEFAULT_GPU_TIMEOUT_S, int(deadline_s / 3)))

    def probe_one(host: Host) -> _Probed:
        t0 = time.monotonic()
        from ddtreectl.transport import connect
        from ddtreectl.transport.mux import MuxTransport

        with connect(host, inventory, reuse=reuse) as transport:
            t1 = time.monotonic()
            mux = transport if isinstance(transport, MuxTransport) else None
            warm = mux is not None and os.path.exists(mux.control_path)
            service = inventory.service_of(host)
            # Only rank 0 of a multi-node service serves HTTP: the other ranks have no port to ask.
            port = service.port if service and (not service.nodes or service.nodes[0] == host.name) else None

            def probe() -> HostFacts:
                remaining = max(1.0, deadline_s - (time.monotonic() - started))
                return probe_status(transport, unit=service.unit if service else None,
                                    remote_root=host.remote_root, timeout=remaining,
                                    gpu_timeout_s=gpu_timeout, port=port)

            facts = probe()
            # A warm master was authenticated earlier: the host's keys may have changed since, and
            # its sshd may have stopped accepting connections (the master's own one lives on). Then
            # the master is closed and Paramiko connects afresh (HostKeyError, exit 4, on a real
            # key mismatch; ConnectError when sshd is gone); the probe runs on that connection.
            if mux is not None and not (mux.confirm_sshd_listening(facts.sshd_listening)
                                        and mux.confirm_host_keys(facts.host_keys or ())):
                facts = probe()
            t2 = time.monotonic()
            connection: Connection | None = None
            if mux is not None and not mux.via_paramiko:
                connection = "reused" if warm else "new"
            elif host.transport == "ssh":
                connection = "paramiko"
        connect_ms = None if mux is not None else (t1 - t0) * 1000
        return _Probed(facts, connect_ms, (t2 - t1) * 1000, connection,
                       tuple(unit_drift(inventory, host, facts)))

    fleet = run_on_hosts(hosts, probe_one, deadline_s=deadline_s, deadline_option="--timeout")
    statuses = tuple(_host_status(r, tuple(w.message for w in inventory.warnings_of(r.host.name)))
                     for r in fleet.results)
    return StatusReport(statuses, deadline_s, time.monotonic() - started)


def _host_status(result: HostResult[_Probed], entry_warnings: tuple[str, ...] = ()) -> HostStatus:
    """The host's status; `entry_warnings` (what is wrong with its inventory entry) come first in its
    warnings, whether it answered or not."""
    host = result.host
    if result.value is not None:
        probed = result.value
        facts = probed.facts
        warnings = entry_warnings + tuple(warnings_for(host, facts)) + tuple(probed.drift) + tuple(
            status_warning(host.name, unit) for unit in facts.other_units)
        outcome: Outcome = "ok"
        error = hint = ""
        if host.machine_id and facts.machine_id and facts.machine_id != host.machine_id:
            # The pinned key matched, yet the OS identity differs: a cloned key or a swapped box.
            outcome = "refused"
            error = (f"machine-id is {facts.machine_id}, recorded {host.machine_id}: "
                     f"another machine answers at {host.address}")
            hint = (f"check which machine has {host.address}; if the box was replaced on purpose, "
                    f"update hosts.{host.name}.machine_id")
        return HostStatus(host, outcome, facts=facts, error=error, hint=hint,
                          connect_ms=probed.connect_ms, probe_ms=probed.probe_ms,
                          connection=probed.connection, warnings=warnings)
    exc = result.error
    if not isinstance(exc, DdtreeError):
        return HostStatus(host, "failed", error=f"internal error: {type(exc).__name__}: {exc}",
                          hint="run with --debug and report this as a bug", exception=exc,
                          warnings=entry_warnings)
    if isinstance(exc, DeadlineExceededError):
        outcome = "timeout"
    elif isinstance(exc, (HostKeyError, IdentityMismatchError)):
        outcome = "refused"
    elif isinstance(exc, ConnectError):
        outcome = "unreachable"
    else:
        outcome = "failed"
    return HostStatus(host, outcome, error=exc.message, hint=exc.hint or "", exception=exc,
                      warnings=entry_warnings)
