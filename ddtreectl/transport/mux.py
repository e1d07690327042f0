"""MuxTransport: commands through OpenSSH with the connection kept warm across invocations.

Why: a new SSH connection costs the host ~80 ms before the first command runs (sshd's PAM and
logind session set-up) on top of the key exchange; a status that opens one connection per
invocation pays it every time, while Ansible's ControlPersist pays it once. Here `ssh` runs with
ControlMaster=auto + ControlPersist: the first command to a host starts a background master, the
next ones (from later invocations too) open a session on it in a few ms.

Same trust rules as the Paramiko path (ssh.py): the argv comes from openssh.py (host key pinned
by host NAME through HostKeyAlias and a private known_hosts, StrictHostKeyChecking, BatchMode,
`-F /dev/null`), and the master's socket path is keyed by address, port, user, identity and the
pinned key (control.py). Two things OpenSSH cannot see are handled here and in the status probe:

- A master authenticated earlier keeps talking to the same sshd even after the host's keys
  changed. The status probe reads the host's public keys in its one round trip; `confirm_host_keys`
  closes the master and asks Paramiko for the verdict when the pinned key is not among them.
- Stopping sshd closes its listener, not the connections it accepted: a warm master keeps
  running commands on a host that no longer accepts logins. The probe reports whether the port
  its session came in on still has a listener; `confirm_sshd_listening` closes the master when
  not, and the fresh connection's verdict (connection refused, exit 4) is the answer.
- Errors: `ssh` exits 255 both for its own failures and for a command exiting 255, so the remote
  side prints a marker on stderr first. No marker + 255: a connection failure, worded like
  Paramiko's where `ssh` says unambiguously what happened (refused, timed out, no route), and
  otherwise (host key, authentication, anything else) redone through Paramiko, whose messages
  (fingerprints, the `trust` hint, exit 4) are the reference. The command had not started, so
  running it there is safe.

Only direct connections are multiplexed: through a jump host the master's tunnel would also hide
a rekeyed bastion, which the probe cannot see, so jump chains keep the Paramiko path.
"""

from __future__ import annotations

import os
import selectors
import shutil
import subprocess
import threading
import time
from typing import Callable, Sequence

from ddtreectl.errors import CommandTimeoutError, InventoryError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.transport import control, openssh
from ddtreectl.transport.base import HttpResponse, RunResult, Transport
from ddtreectl.transport.command import wrap_command
from ddtreectl.transport.hostkeys import PublicKey, pinned_key
from ddtreectl.transport.local import LineSplitter, feed_stdin
from ddtreectl.transport.reasons import REFUSED, TIMED_OUT, connect_error

CONTROL_PERSIST_S = 60  # idle master lifetime: covers an operator's burst of commands
# Keepalives so a master whose host vanished (moved, powered off) exits within ~15 s instead of
# serving sessions into a dead TCP connection.
SERVER_ALIVE_INTERVAL_S = 5
SERVER_ALIVE_COUNT_MAX = 2
STARTED_MARKER = "@@ddtreectl-started"
# OpenSSH 9.x prefers the sntrup761x25519 hybrid key exchange, whose client-side key generation
# costs ~70 ms of CPU per new connection here (measured: 80 ms vs 10 ms with curve25519, which
# is what the Paramiko path negotiates). Dropped by name (both spellings; unknown names are
# ignored), so a client whose defaults include the cheap ML-KEM hybrid keeps it.
KEX_WITHOUT_SNTRUP = "-sntrup761x25519-sha512@openssh.com,sntrup761x25519-sha512"
_NETWORK_HINT = "check the address and the network path to the host"


def open_mux(host: Host, inventory: Inventory | None) -> "MuxTransport | None":
    """A MuxTransport for `host`, or None when this host must take the Paramiko path: reuse off
    (`ssh_reuse: false` in the inventory, $DDTREECTL_SSH_REUSE=0), no `ssh` binary, a jump
    host, no pinned key (Paramiko shows the key with the `trust` hint) or no safe control
    directory. Touches no network."""
    if (host.transport != "ssh" or host.jump_host is not None or not host.ssh_reuse
            or not control.reuse_enabled()):
        return None
    if shutil.which("ssh") is None:
        control.debug("%s: no ssh binary on PATH; using Paramiko", host.name)
        return None
    pinned = pinned_key(host)  # a malformed pin raises InventoryError here, as on the other path
    if pinned is None:
        return None
    path = control.control_path(host)
    if path is None:
        return None
    return MuxTransport(host, inventory, pinned, path)


class MuxTransport:
    """One host reached through an OpenSSH master (see the module docstring). Same contract as
    SshTransport; HTTP and port checks go through a Paramiko connection opened on demand."""

    def __init__(self, host: Host, inventory: Inventory | None, pinned: PublicKey,
                 control_path: str) -> None:
        self.host = host
        self.host_name = host.name
        self.control_path = control_path
        self._inventory = inventory
        self._pinned = pinned
        self._fallback: Transport | None = None
        known_hosts = control_path + control.KNOWN_HOSTS_SUFFIX
        control.prune_known_hosts(os.path.dirname(control_path))
        if _same_file_text(known_hosts, openssh.known_hosts_text([(host, pinned)])):
            try:
                os.utime(known_hosts)  # in use: keeps prune_known_hosts away from it
            except OSError:
                pass
        else:
            # temp + rename: another invocation's ssh may be reading it right now
            temp = f"{known_hosts}.{os.getpid()}.{threading.get_ident()}"
            openssh.write_known_hosts(temp, [(host, pinned)])
            os.replace(temp, known_hosts)
        cp = control_path.replace("%", "%%")
        self._argv = openssh.ssh_argv([(host, pinned)], known_hosts) + [
            "-o", "ControlMaster=auto", "-o", f"ControlPath={cp}",
            "-o", f"ControlPersist={CONTROL_PERSIST_S}",
            "-o", f"ServerAliveInterval={SERVER_ALIVE_INTERVAL_S}",
            "-o", f"ServerAliveCountMax={SERVER_ALIVE_COUNT_MAX}",
            "-o", f"KexAlgorithms={KEX_WITHOUT_SNTRUP}",
            "-o", "LogLevel=ERROR",
        ]
        address = f"[{host.address}]" if ":" in host.address else host.address
        self._where = f"{host.address}:{host.port}"
        self._destination = address

    @property
    def via_paramiko(self) -> bool:
        """True once this transport fell back to a Paramiko connection."""
        return self._fallback is not None

    # ---- running --------------------------------------------------------------------------

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> RunResult:
        if self._fallback is not None:
            return self._fallback.run(command, timeout=timeout, stdin=stdin, on_line=on_line, on_tick=on_tick)
        limit = self.host.command_timeout if timeout is None else timeout
        started = time.monotonic()
        # The marker is printed by the /bin/sh that runs the command (inside wrap_command), so
        # it works whatever the login shell is (csh would read a bare `>&2` differently).
        remote = wrap_command(f"printf '%s\\n' {STARTED_MARKER} >&2\n{command}", limit)
        # A session on a live master starts in milliseconds and a new connection is bounded by
        # ssh's ConnectTimeout; no start by then means a master stuck on a dead TCP connection.
        # A warm master gets one connect timeout, not three: after an IP move its wait plus the
        # fresh connect that follows must fit in status's default deadline (5 s + 1 + 5 < 20 s;
        # 3 x 5 + 1 + 5 did not, and the host read "no answer, raise --deadline" instead of
        # "unreachable, set-ip").
        connect = max(1.0, self.host.connect_timeout)
        warm = os.path.exists(self.control_path)
        start_by = started + min(limit, (connect if warm else 3 * connect) + 1)
        outcome = _execute(self._argv + [self._destination, remote], stdin, started + limit,
                           start_by, on_line, on_tick)
        if outcome.started:
            if outcome.timed_out:
                raise CommandTimeoutError(
                    f"command timed out after {limit:g} s: {command[:117]}",
                    hint="raise the timeout (command_timeout in the inventory) or check the host",
                    host=self.host_name,
                )
            return RunResult(command=command, exit_code=outcome.code, stdout=outcome.stdout,
                             stderr=outcome.stderr, duration_s=time.monotonic() - started)
        if outcome.timed_out:
            control.debug("%s: no session within %.1f s; closing the master", self.host_name,
                          start_by - started)
            control.close_master(self.control_path)
        elif outcome.code != 255:
            # The login shell itself refused (e.g. nologin) before our marker: its answer.
            return RunResult(command=command, exit_code=outcome.code, stdout=outcome.stdout,
                             stderr=outcome.stderr, duration_s=time.monotonic() - started)
        else:
            classified = self._classify(outcome.stderr)
            if classified is not None:
                raise connect_error(self.host, self._where, *classified)
            control.debug("%s: ssh failed (%s); asking Paramiko", self.host_name,
                          outcome.stderr.strip())
        remaining = max(1.0, limit - (time.monotonic() - started))
        return self._paramiko().run(command, timeout=remaining, stdin=stdin, on_line=on_line, on_tick=on_tick)

    @staticmethod
    def _classify(stderr: str) -> tuple[str, str] | None:
        """(reason, hint) when ssh's own words say unambiguously why it could not connect."""
        for line in stderr.splitlines():
            if line.startswith("ssh: connect to host ") or "during banner exchange" in line:
                text = line.lower()
                if "connection refused" in text:
                    return REFUSED
                if "timed out" in text:
                    return TIMED_OUT
                if "no route to host" in text:
                    return "no route to host", _NETWORK_HINT
                if "network is unreachable" in text:
                    return "network is unreachable", _NETWORK_HINT
            if line.startswith("ssh: Could not resolve hostname "):
                why = line.rsplit(": ", 1)[-1].strip()
                return f"cannot resolve address ({why})", "check `address:` in the inventory"
        return None

    def confirm_host_keys(self, host_keys: Sequence[str]) -> bool:
        """Check the keys the host reports (its /etc/ssh/ssh_host_*_key.pub, read by the probe)
        against the pin. True: the pinned key is still the host's. False: the master was closed
        and a Paramiko connection verified the host afresh (run the command again: it goes
        there). Raises HostKeyError (exit 4, both fingerprints) when the host's key changed."""
        if self._fallback is not None:
            return True  # verified by Paramiko at connect
        for line in host_keys:
            try:
                if PublicKey.parse(line) == self._pinned:
                    return True
            except InventoryError:
                continue
        control.debug("%s: pinned key not among the host's keys; closing the master", self.host_name)
        control.close_master(self.control_path)
        self._paramiko()
        return False

    def confirm_sshd_listening(self, listening: bool | None) -> bool:
        """Check what the probe saw of sshd's listener (None: not known, trusted as before). True: it
        still accepts connections, or this transport is not on a master. False: the master was
        closed and a Paramiko connection was opened afresh (run the command again: it goes there);
        with sshd really gone that connect raises ConnectError, exactly as without a master."""
        if self._fallback is not None or listening is not False:
            return True
        control.debug("%s: sshd no longer listens on the port of this master's connection; closing the master",
                      self.host_name)
        control.close_master(self.control_path)
        self._paramiko()
        return False

    def _paramiko(self) -> Transport:
        if self._fallback is None:
            from ddtreectl.transport import connect

            self._fallback = connect(self.host, self._inventory, reuse=False)
        return self._fallback

    def http_get(self, port: int, path: str, *, timeout: float) -> HttpResponse:
        return self._paramiko().http_get(port, path, timeout=timeout)

    def port_open(self, port: int, *, timeout: float) -> bool:
        return self._paramiko().port_open(port, timeout=timeout)

    def rsync_ssh_command(self) -> list[str]:
        """The same pinned argv, so rsync rides on the master too."""
        return list(self._argv)

    def rsync_destination(self, path: str) -> str:
        return f"{self.host.user}@{self._destination}:{path}"

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close a Paramiko fallback; the master stays up for the next command (ControlPersist)."""
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None

    def __enter__(self) -> "MuxTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Outcome:
    def __init__(self, code: int, stdout: str, stderr: str, started: bool, timed_out: bool) -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr
        self.started, self.timed_out = started, timed_out


def _execute(argv: list[str], stdin: bytes | None, deadline: float, start_by: float,
             on_line: Callable[[str], None] | None, on_tick: Callable[[], None] | None = None) -> _Outcome:
    """Run the ssh client; collect output until it exits. Killed (by PID: the client only, never
    the master) at `deadline`, or at `start_by` when the remote side has not started by then.

    Reads stderr only until the client exits, not until EOF: a master's ProxyCommand or a
    detaching master may keep a copy of that pipe open for as long as it lives.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    if stdin is not None:
        assert proc.stdin is not None
        threading.Thread(target=feed_stdin, args=(proc.stdin, stdin), daemon=True).start()
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    lines = LineSplitter(on_line)
    started = timed_out = False
    marker = STARTED_MARKER.encode() + b"\n"
    pidfd = _pidfd(proc.pid)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, out)
            sel.register(proc.stderr, selectors.EVENT_READ, err)
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ, None)
            while True:
                if on_tick is not None:
                    on_tick()
                exited = proc.poll() is not None
                now = time.monotonic()
                limit = deadline if started else min(deadline, start_by)
                if not exited and now >= limit:
                    proc.kill()
                    proc.wait()
                    timed_out = True
                    break
                wait = 0.0 if exited else min(limit - now, 1.0 if pidfd is not None else 0.02)
                events = [key for key, _ in sel.select(wait) if key.data is not None]
                for key in events:
                    data = os.read(key.fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    key.data.extend(data)
                    if key.data is out:
                        lines.feed(data)
                    elif not started and marker in err:
                        started = True
                if exited and not events:
                    break
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finally:
        if pidfd is not None:
            os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
    lines.flush()
    text = err.decode("utf-8", "replace")
    if started:
        text = text.replace(STARTED_MARKER + "\n", "", 1)
    return _Outcome(proc.returncode, out.decode("utf-8", "replace"), text, started, timed_out)


def _pidfd(pid: int) -> int | None:
    """A descriptor that turns readable when the process exits (Linux >= 5.3), else None (poll)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
        return fd
    except OSError:
        return None


def _same_file_text(path: str, text: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read() == text
    except OSError:
        return False
