"""One error family for the whole CLI. Each error carries its exit code and an optional hint.

Only `ddtreectl.cli` turns these into output and an exit status; every layer below raises them.
Exit codes (shared/design.md): 0 ok, 1 internal, 2 usage, 3 inventory invalid, 4 connection or
host-key refused, 5 remote command or build failed, 6 some hosts failed, 7 GPUs busy or not idle,
8 lock held by someone else, 130 interrupted.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    INVENTORY = 3
    CONNECTION = 4
    REMOTE = 5
    PARTIAL = 6
    GPUS_BUSY = 7
    LOCKED = 8
    INTERRUPTED = 130


class DdtreeError(Exception):
    """Base of every error ddtreectl reports to the operator."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(self, message: str, *, hint: str | None = None, host: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.host = host

    def __str__(self) -> str:
        return f"{self.host}: {self.message}" if self.host else self.message


def fan_out_exit_code(failed: list[int], total: int) -> int:
    """The exit status of a command run over `total` hosts whose failed hosts' codes are `failed`: 0
    when none failed; the code they share when every host failed the same way, so one host alone
    exits as a single-host command would (unreachable: 4, refused gate: 5); else 6 (some hosts
    succeeded, or the failures differ). README "Exit codes" states this rule for every fan-out."""
    if not failed:
        return int(ExitCode.OK)
    if len(failed) == total and len(set(failed)) == 1:
        return failed[0]
    return int(ExitCode.PARTIAL)


class UsageError(DdtreeError):
    exit_code = ExitCode.USAGE


class InventoryError(DdtreeError):
    """The inventory file is missing, malformed or inconsistent (message names file:line: key)."""

    exit_code = ExitCode.INVENTORY


class ConnectError(DdtreeError):
    """A host could not be reached (refused, timed out, authentication failed)."""

    exit_code = ExitCode.CONNECTION


class AuthenticationError(ConnectError):
    """The host answered and its key was accepted, but the login failed (user, identity file): an
    inventory or authorized_keys problem, not a network one."""


class HostKeyError(ConnectError):
    """The host presented a key that is unknown or differs from the one pinned for its name."""


class IdentityMismatchError(ConnectError):
    """The machine at an address is not the machine recorded for the host (key, machine-id, GPUs)."""


class RemoteCommandError(DdtreeError):
    """A remote command, build or self-test failed."""

    exit_code = ExitCode.REMOTE


class CommandTimeoutError(RemoteCommandError):
    """A remote command ran past its timeout and was stopped. What it did before that stays done: a
    `systemctl start` may well have queued its job, so a caller that must know looks at the host."""


class RunTimeoutError(CommandTimeoutError):
    """`ddtreectl run`'s own command ran past --timeout and was killed (it had started: its output
    until then is real), as opposed to a step before it timing out."""


class ServiceStartError(RemoteCommandError):
    """`systemctl enable` or `start` itself failed (nothing was queued); `enabled` says whether the
    unit had just been enabled by the same step, so a caller can put that back; `units_removed` the
    stopped units of an older name the restore had already removed before it (a change on the host
    that every report of the failure must still show)."""

    def __init__(self, message: str, *, enabled: bool, warnings: list[str] | None = None,
                 hint: str | None = None, host: str | None = None) -> None:
        super().__init__(message, hint=hint, host=host)
        self.enabled = enabled
        self.warnings = list(warnings or [])
        self.units_removed: list[str] = []


class PartialFailureError(DdtreeError):
    """Some hosts of a fan-out failed; the others succeeded."""

    exit_code = ExitCode.PARTIAL


class GpusBusyError(DdtreeError):
    """GPUs are busy or their state is unknown where idle GPUs are required."""

    exit_code = ExitCode.GPUS_BUSY


class LockHeldError(DdtreeError):
    """Someone else holds the host's deploy lock or development lease."""

    exit_code = ExitCode.LOCKED


class InterruptedByOperatorError(DdtreeError):
    """The operator interrupted the command (Ctrl-C)."""

    exit_code = ExitCode.INTERRUPTED


class TemplateError(DdtreeError):
    """A unit or config template failed to render (missing variable, syntax error)."""

    exit_code = ExitCode.INVENTORY
