"""`run` as an operation: a development command in the host's current release directory, allowed only
while the host is in development mode held by the caller (or with --force, recorded in the audit log),
so nobody starts a benchmark on a serving host by accident."""

from __future__ import annotations

import shlex
from typing import Callable, Sequence

from ddtreectl.errors import CommandTimeoutError, GpusBusyError, LockHeldError, RemoteCommandError, RunTimeoutError
from ddtreectl.inventory.models import Host
from ddtreectl.operations.audit import append_audit, operator, remote_path
from ddtreectl.operations.mode import HostMode, read_mode
from ddtreectl.probes.mode_lease import utc
from ddtreectl.transport.base import Transport


def check_run_allowed(state: HostMode, host: Host, me: str) -> None:
    """Raise unless `me` holds a live development lease on the host (pure)."""
    lease = state.lease
    if lease is None or lease.mode == "prod":
        raise GpusBusyError(
            "is in production mode (nobody holds it for development)",
            hint=f"ddtreectl mode {host.name} dev --reason '…' first (or --force to run anyway)",
            host=host.name)
    if lease.mode != "dev":
        raise LockHeldError(f"mode unknown: {lease.describe(state.now)}",
                            hint=f"inspect with `ddtreectl mode {host.name}`, or --force", host=host.name)
    if lease.holder != me:
        raise LockHeldError(f"{lease.describe(state.now)}; not yours ({me})",
                            hint=f"ask {lease.holder}, or --force (recorded in the audit log)", host=host.name)
    if lease.expired(state.now):
        raise LockHeldError(f"your development lease expired at {utc(lease.expires)}",
                            hint=f"renew it: ddtreectl mode {host.name} dev --reason '…' [--ttl 8h]",
                            host=host.name)


def run_dev(transport: Transport, host: Host, argv: Sequence[str], *, force: bool = False,
            timeout_s: float = 86400.0, on_line: Callable[[str], None] = lambda line: None) -> int:
    """Run `argv` in `<remote_root>/current` with stdout and stderr streamed line by line to `on_line`;
    returns the command's exit status. Killed at `timeout_s`: RunTimeoutError, after `on_line` had every
    line it printed until then."""
    if not argv:
        raise RemoteCommandError("no command given", hint=f"ddtreectl run {host.name} -- CMD [ARGS...]",
                                 host=host.name)
    me = operator()
    state = read_mode(transport, host.remote_root)
    forced = None
    try:
        check_run_allowed(state, host, me)
    except (GpusBusyError, LockHeldError) as refused:
        if not force:
            raise
        forced = refused.message
    if not state.current_exists:
        raise RemoteCommandError(f"{host.remote_root}/current does not exist: no release deployed",
                                 hint=f"ddtreectl deploy --host {host.name}", host=host.name)
    command = " ".join(shlex.quote(a) for a in argv)
    not_audited = append_audit(transport, host.remote_root, "run", command=command, forced=forced)
    if not_audited:
        on_line(f"warning: {not_audited}")
    # stderr joins stdout so both stream in order. No `exec`: the shell stays to turn a death by signal
    # into 128+N (SSH reports no exit status for a command killed by a signal).
    wrapped = f"cd {remote_path(host.remote_root, 'current')}/ && exec 2>&1 && {command}"
    try:
        return transport.run(wrapped, timeout=timeout_s, on_line=on_line).exit_code
    except CommandTimeoutError:
        raise RunTimeoutError(
            f"`{command}` ran past --timeout {timeout_s:g} s and was killed", host=host.name,
            hint=f"raise --timeout (seconds): ddtreectl run {host.name} --timeout 7200 -- …",
        ) from None
