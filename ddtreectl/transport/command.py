"""The command string both SSH paths hand sshd (Paramiko-free, so the OpenSSH path can use it too)."""

from __future__ import annotations

import re
import shlex
import time
from typing import Any

REMOTE_KILL_AFTER_S = 5  # remote `timeout -k`: SIGKILL this long after SIGTERM


PID_MARKER = "@@ddtreectl-pid"  # announce_pid: "<marker> <pid>" is the first line ddtreectl's sh writes to stderr


def remote_timeout_s(timeout: float) -> int:
    """The remote `timeout` wrapper's limit: a little after the client's own deadline."""
    return max(1, int(timeout) + 1)


def wrap_command(command: str, timeout: float, *, announce_pid: bool = False) -> str:
    """What we hand sshd: POSIX sh whatever the login shell, killed remotely at the timeout too.

    GNU `timeout` puts the command in its own process group and signals the whole group, so a
    timed-out command's children die with it even though closing the channel alone would not
    kill them. Where `timeout` is missing (minimal images) the command runs without it.
    The command travels as ONE positional parameter, quoted once: nesting it inside the
    wrapper's own quotes would multiply every `'` and could push a big script past Linux's
    128 KiB limit for a single argument (MAX_ARG_STRLEN) when the login shell runs it.
    With `announce_pid`, the sh first writes its PID to stderr (PID_MARKER): it execs `timeout`
    (or the command), so that PID leads the process group holding all of the command, which a
    client that abandons the command can kill over a second channel (ssh.py).
    """
    secs = remote_timeout_s(timeout)
    announce = f'echo "{PID_MARKER} $$" >&2; ' if announce_pid else ""
    wrapper = (f'{announce}if command -v timeout >/dev/null 2>&1; then exec timeout -k {REMOTE_KILL_AFTER_S} '
               f'{secs} /bin/sh -c "$1"; else exec /bin/sh -c "$1"; fi')
    return f"exec /bin/sh -c {shlex.quote(wrapper)} ddtreectl {shlex.quote(command)}"


_PID_LINE = re.compile(rf"^{PID_MARKER} (\d+)\n", re.MULTILINE)  # a noisy rc file may write before it


def strip_pid_line(stderr: str) -> str:
    """The command's stderr without the wrapper's PID announcement."""
    return _PID_LINE.sub("", stderr, count=1)


def announced_pid(chan: Any, err: bytearray, wait_s: float = 2.0) -> int | None:
    """The PID the wrapper announced on a Paramiko channel's stderr (`err`: what was read so far;
    reads on for up to `wait_s` when it has not arrived yet). None: never announced."""
    end = time.monotonic() + wait_s
    while True:
        found = _PID_LINE.search(err.decode("utf-8", "replace"))
        if found or time.monotonic() > end or chan.exit_status_ready():
            return int(found.group(1)) if found else None
        if chan.recv_stderr_ready():
            err.extend(chan.recv_stderr(65536))
        else:
            time.sleep(0.05)
