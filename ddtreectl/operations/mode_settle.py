"""`mode HOST prod` broken off half way (Ctrl-C / SIGTERM, a timed-out or dropped command) after it may
have enabled or started the unit: settle the host so nothing is left half-changed, and say which way.

Before, the unit was left ENABLED under the development lease: the next reboot started production on
the holder's GPUs, and `status` showed a host held for development with an enabled service. Now the
unit's real state decides (one `systemctl show` over the same connection):

- it runs, is starting or has a start job queued: the start took, so the switch is FINISHED the way a
  failed health gate finishes it (mode.py): the development lease ends (the host is production's), and
  the message says its health was not verified and that `restore-service` verifies it;
- nothing runs and no job is queued: ROLLED BACK: an enable this command made is undone (disabled
  again, as `mode dev` left it) and the development lease is kept;
- the state cannot be read (the link dropped, a second Ctrl-C): said as unknown, with the commands
  that show and settle it — never a guess.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ddtreectl.inventory.models import Host
from ddtreectl.transport.base import Transport


@dataclass(frozen=True)
class Settled:
    """How a broken-off `mode prod` was settled."""

    outcome: str  # "finished" (the start took: lease ended) | "rolled back" (lease kept) | "unknown"
    words: str  # what the host is left in, for the error message


def unit_state(transport: Transport, host: Host, unit: str) -> tuple[bool, bool, str]:
    """(runs or is starting or has a start job queued, enabled, the state in words)."""
    u = shlex.quote(unit)
    out = transport.run(f"systemctl show -p ActiveState -p SubState -p Job -p UnitFileState -- {u}",
                        timeout=min(host.command_timeout, 30)).stdout
    props = dict(line.strip().split("=", 1) for line in out.splitlines() if "=" in line)
    active, sub, job = props.get("ActiveState", ""), props.get("SubState", ""), props.get("Job", "").strip()
    queued = job not in ("", "0")
    running = active in ("active", "activating", "reloading") or queued
    enabled = props.get("UnitFileState", "") in ("enabled", "enabled-runtime")
    return running, enabled, f"{active or 'unknown'}/{sub or 'unknown'}" + (f", job {job} queued" if queued else "")


def undo_enable(transport: Transport, host: Host, unit: str) -> str:
    """Disable `unit` again (this command enabled it; `mode dev` had left it disabled): the words for what the
    unit is left in. Shared by a failed start (mode._start_failed) and a broken-off switch (settle)."""
    undo = transport.run(f"systemctl disable --quiet -- {shlex.quote(unit)}", timeout=host.command_timeout)
    if undo.ok:
        return f"{unit} disabled again"
    return (f"{unit} is left ENABLED: disabling it failed: {undo.stderr.strip()[-200:]}; "
            f"run `systemctl disable {unit}`")


def settle(transport: Transport, host: Host, unit: str, *, was_enabled: bool, holder: str | None) -> Settled:
    """Finish or roll back (see the module docstring); never raises for the host's answer."""
    kept = f"the development lease of {holder} is kept" if holder else "the lease is unchanged"
    try:
        running, enabled, state = unit_state(transport, host, unit)
        if running:
            return Settled("finished", f"{unit} had been started ({state}), so the switch was finished: the host "
                                       "is in production mode now (the development lease has ended); its health "
                                       "was NOT verified")
        put_back = f"{unit} {'enabled' if enabled else 'disabled'} as before"
        if enabled and not was_enabled:
            put_back = undo_enable(transport, host, unit)
        return Settled("rolled back", f"nothing was started ({unit} is {state}), so the switch was rolled back: "
                                      f"{put_back}; the host stays in development mode ({kept})")
    except (Exception, KeyboardInterrupt) as unread:  # the link dropped, or a second Ctrl-C
        why = getattr(unread, "message", None) or type(unread).__name__
        return Settled("unknown", f"the state of {unit} could not be read afterwards ({why}): it may be enabled "
                                  "and starting while the development lease is still recorded")


def next_step(settled: Settled, host: str) -> str:
    """The hint that goes with a settled switch."""
    if settled.outcome == "finished":
        return f"`ddtreectl restore-service {host}` verifies it (health gate); `ddtreectl logs {host}` shows it"
    if settled.outcome == "rolled back":
        return f"`ddtreectl mode {host} prod` again when you are ready"
    return (f"`ddtreectl status {host}` shows the unit and the lease; `ddtreectl mode {host} prod` again finishes "
            f"the switch (or `systemctl disable` the unit on the host to keep it in development)")
