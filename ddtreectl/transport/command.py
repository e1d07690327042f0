"""The command string both SSH paths hand sshd (Paramiko-free, so the OpenSSH path can use it too)."""

from __future__ import annotations

import shlex

REMOTE_KILL_AFTER_S = 5  # remote `timeout -k`: SIGKILL this long after SIGTERM


def wrap_command(command: str, timeout: float) -> str:
    """What we hand sshd: POSIX sh whatever the login shell, killed remotely at the timeout too.

    GNU `timeout` puts the command in its own process group and signals the whole group, so a
    timed-out command's children die with it even though closing the channel alone would not
    kill them. Where `timeout` is missing (minimal images) the command runs without it.
    The command travels as ONE positional parameter, quoted once: nesting it inside the
    wrapper's own quotes would multiply every `'` and could push a big script past Linux's
    128 KiB limit for a single argument (MAX_ARG_STRLEN) when the login shell runs it.
    """
    secs = max(1, int(timeout) + 1)  # a little after the client's own deadline
    wrapper = (f'if command -v timeout >/dev/null 2>&1; then exec timeout -k {REMOTE_KILL_AFTER_S} '
               f'{secs} /bin/sh -c "$1"; else exec /bin/sh -c "$1"; fi')
    return f"exec /bin/sh -c {shlex.quote(wrapper)} ddtreectl {shlex.quote(command)}"
