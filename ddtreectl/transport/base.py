"""The Transport protocol: how ddtreectl runs commands on a host, whatever the wire.

`local.py` runs on this machine (the `local` host); `ssh.py` is the only module that touches
Fabric/Paramiko. Everything above this layer talks to hosts through these methods only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ddtreectl.errors import ConnectError


@dataclass(frozen=True)
class RunResult:
    """Outcome of one remote command."""

    command: str
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class HttpResponse:
    """A small HTTP response fetched through the transport (for health checks)."""

    status: int
    body: bytes
    headers: dict[str, str]


class PortClosedError(ConnectError):
    """Nothing accepts TCP connections on the port, as seen from the host; the link to the host
    itself is fine (http_get raises it; port_open answers False)."""


class Transport(Protocol):
    """One open connection to one host. Use as a context manager; close() is idempotent."""

    host_name: str

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> RunResult:
        """Run `command` (a complete shell string, parts already shlex-quoted) with /bin/sh.

        Never raises on a non-zero exit status; raises ConnectError when the host is unreachable
        and RemoteCommandError when `timeout` expires. `on_line` receives stdout lines as they come.
        `on_tick` is called at least once a second while the command runs, output or not, so a
        caller can abandon a quiet command (a long compile step) when the user cancels: whatever it
        (or `on_line`) raises stops the command and propagates.
        """
        ...

    def http_get(self, port: int, path: str, *, timeout: float) -> HttpResponse:
        """GET http://127.0.0.1:<port><path> as seen FROM the host (an SSH-forwarded channel)."""
        ...

    def port_open(self, port: int, *, timeout: float) -> bool:
        """Whether a TCP connection to 127.0.0.1:<port> on the host succeeds."""
        ...

    def rsync_ssh_command(self) -> list[str] | None:
        """The `ssh` argv rsync should use (`-e`) to reach this host with the pinned key, or None
        for a local transport (rsync then copies locally)."""
        ...

    def rsync_destination(self, path: str) -> str:
        """`user@address:path` for SSH, `path` for local."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> "Transport": ...

    def __exit__(self, *exc: object) -> None: ...
