"""Where OpenSSH master connections live, and how to find or close one (no network, no Paramiko).

A master is keyed by everything its authenticated connection depends on: this machine, the host's
NAME, its address, port, user, identity file and the key pinned for the NAME. Change any of them
(`set-ip`, `trust --replace`, an inventory edit) and the next command gets a new master, verified
from scratch; the old one idles out after ControlPersist. OpenSSH's own `%C` hashes only
host/port/user/local host, not the pinned key, hence our own hash.

Masters live in a private per-user directory (0700, ours, not a symlink), checked before every
use: a socket there is a logged-in session to a production host.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import stat
import subprocess
import time

from ddtreectl.inventory.models import Host
from ddtreectl.transport.hostkeys import pinned_key

ENV_REUSE = "DDTREECTL_SSH_REUSE"  # "0" (or no/false/off): fresh connections, no masters
ENV_CONTROL_DIR = "DDTREECTL_SSH_CONTROL_DIR"  # where masters live (tests point it at a temp dir)
# sun_path holds 108 bytes; while binding, ssh appends "." plus 16 random characters.
MAX_CONTROL_PATH = 108 - 18
OFF_WORDS = frozenset({"0", "no", "false", "off"})


def debug(message: str, *args: object) -> None:
    """A debug note (why reuse was skipped). `logging` loads only when there is one to write:
    it costs a few ms of every start, and the normal path has nothing to say."""
    import logging

    logging.getLogger("ddtreectl.transport").debug(message, *args)


def reuse_enabled() -> bool:
    """Whether connection reuse is allowed by the environment ($DDTREECTL_SSH_REUSE)."""
    return os.environ.get(ENV_REUSE, "1").strip().lower() not in OFF_WORDS


def control_dir() -> str | None:
    """The private directory for master sockets, created 0700; None when it is not safe to use
    (not ours, not a directory, group/other access we cannot remove) or cannot be created."""
    explicit = os.environ.get(ENV_CONTROL_DIR)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if explicit:
        path = explicit
    elif runtime and os.path.isabs(runtime):
        path = os.path.join(runtime, "ddtreectl", "cm")
    else:
        path = os.path.join(os.path.expanduser("~"), ".cache", "ddtreectl", "cm")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            debug("not reusing SSH connections: %s is not a directory owned by us", path)
            return None
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
    except OSError as exc:
        debug("not reusing SSH connections: control dir %s: %s", path, exc)
        return None
    return path


def control_key(host: Host) -> str:
    """32 hex digits naming the master for `host` as the inventory describes it now."""
    pinned = pinned_key(host)
    parts = [socket.gethostname(), host.name, host.address, str(host.port), host.user,
             host.identity_file or "", pinned.line if pinned else ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def control_path(host: Host, directory: str | None = None) -> str | None:
    """The master socket path for `host`, or None when reuse is impossible (no safe directory,
    or a path too long for a Unix socket)."""
    directory = directory if directory is not None else control_dir()
    if directory is None:
        return None
    path = os.path.join(directory, control_key(host))
    if len(os.fsencode(path)) > MAX_CONTROL_PATH:
        debug("not reusing SSH connections: socket path %s is too long", path)
        return None
    return path


KNOWN_HOSTS_SUFFIX = ".known_hosts"
PRUNE_AFTER_S = 24 * 3600
_pruned: set[str] = set()


def prune_known_hosts(directory: str, *, max_age_s: float = PRUNE_AFTER_S) -> int:
    """Remove the private known_hosts files (one per master key, mux.py) that no command has used
    for `max_age_s` and whose master is gone; once per directory per process. Returns how many.
    A file removed just as another invocation starts with it costs that one a Paramiko fallback,
    never a wrong trust decision: a missing file trusts nothing."""
    if directory in _pruned:
        return 0
    _pruned.add(directory)
    removed = 0
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not name.endswith(KNOWN_HOSTS_SUFFIX):
            continue
        path = os.path.join(directory, name)
        try:
            if os.path.exists(path[: -len(KNOWN_HOSTS_SUFFIX)]) or now - os.lstat(path).st_mtime < max_age_s:
                continue
            os.unlink(path)
            removed += 1
        except OSError:
            continue
    return removed


def _control(path: str, operation: str, timeout: float = 5) -> subprocess.CompletedProcess[str] | None:
    """`ssh -O OPERATION` on the master at `path`; None when there is no socket or no ssh."""
    if not os.path.exists(path):
        return None
    try:
        # The destination only fills the command line: `-O` talks to the socket, never the
        # network (and loopback is what it would be if it ever did).
        return subprocess.run(["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-S", path,
                               "-O", operation, "127.0.0.1"],
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        debug("ssh -O %s %s: %s", operation, path, exc)
        return None


def master_pid(path: str) -> int | None:
    """PID of the live master at `path` (`ssh -O check`), or None."""
    done = _control(path, "check")
    if done is None or done.returncode != 0:
        return None
    found = re.search(r"pid=(\d+)", done.stderr + done.stdout)
    return int(found.group(1)) if found else None


def close_master(path: str) -> bool:
    """Ask the master at `path` to exit (its sessions end with it); True if one was running."""
    done = _control(path, "exit")
    if done is None:
        return False
    if done.returncode != 0 and os.path.exists(path):
        try:
            os.unlink(path)  # a dead master's leftover socket; ssh would replace it anyway
        except OSError:
            pass
    return done.returncode == 0


def close_master_for(host: Host) -> bool:
    """Close the master that serves `host` as the inventory describes it now (set-ip and
    trust call this before the entry changes, so no session outlives the trust it was made
    under)."""
    if host.transport != "ssh":
        return False
    try:
        path = control_path(host)
    except Exception:  # noqa: BLE001 - a malformed pin has no master; the caller reports the pin
        return False
    return close_master(path) if path is not None else False


def close_all_masters(directory: str) -> int:
    """Close every master under `directory` (test teardown); returns how many answered."""
    closed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode) and close_master(path):
                closed += 1
        except OSError:
            continue
    return closed
