"""SshTransport: one Paramiko connection per host, host key pinned by NAME, TCP_NODELAY.

The ONLY module that imports Paramiko, and it is itself imported only when an SSH connection is
opened (`import paramiko` costs 0.1-0.35 s; `ddtreectl --help` must not pay it). Importing this module
loads Paramiko without Invoke (see _load_paramiko_without_invoke). We drive `paramiko.Transport` directly rather than SSHClient
or Fabric so that the order is explicit: TCP connect (our socket, TCP_NODELAY) -> key exchange ->
check the presented key against the pin -> only then authenticate. No known_hosts file, no
MissingHostKeyPolicy: trust comes from the inventory alone.

Remote shell, measured on the test hosts (Debian 12, bash 5.2; tests/transport/test_ssh_testbed.py::
test_login_shell_rc_runs_for_every_exec, and against this machine's pyenv-laden /root/.bashrc in
test_ssh_local_sshd.py::test_login_shell_rc_is_sourced: 4 ms -> 94 ms per exec): sshd always runs
`$SHELL -c COMMAND`, and bash then sources ~/.bashrc because it detects sshd (SSH_CLIENT set, or
stdin a socket) — for every exec, before our command, whatever we send. `exec /bin/sh -c ...`
cannot avoid it (bash has already read the rc file by then), and no client-side option can: only
the host's rc file or sshd's config could. So we (1) run every command under /bin/sh (wrap_command)
so it has POSIX sh semantics whatever the login shell (bash, zsh, fish) and never depends on
rc-file aliases or functions, (2) batch remote work into one command per host (each exec pays
the rc cost once), and (3) callers that parse stdout frame their output with a marker line,
because a noisy rc file may print before it (operations/trust.py does).
"""

from __future__ import annotations

import os
import select
import socket
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Callable

from ddtreectl.errors import AuthenticationError, CommandTimeoutError, ConnectError, RemoteCommandError
from ddtreectl.inventory.models import Host
from ddtreectl.transport import http_wire, openssh
from ddtreectl.transport.base import HttpResponse, PortClosedError, RunResult
from ddtreectl.transport.hostkeys import PublicKey, check_presented_key, pinned_key
from ddtreectl.transport.command import (REMOTE_KILL_AFTER_S, announced_pid, remote_timeout_s, strip_pid_line,
                                         wrap_command)
from ddtreectl.transport.local import LineSplitter
from ddtreectl.transport.reasons import connect_error as _connect_error
from ddtreectl.transport.reasons import not_ssh as _not_ssh
from ddtreectl.transport.reasons import reason_of as _reason_of



def _load_paramiko_without_invoke() -> None:
    """Import Paramiko while `import invoke` fails. Paramiko's config module imports Invoke eagerly
    (~75 ms measured here, on every command that opens SSH) only to run `Match exec` lines of
    ssh_config files, which ddtreectl never reads; Paramiko treats a missing Invoke as "no Match exec".
    """
    if "paramiko" in sys.modules or "invoke" in sys.modules:
        return
    sys.modules["invoke"] = None  # type: ignore[assignment]  # makes `import invoke` raise ImportError
    try:
        import paramiko  # noqa: F401
    finally:
        del sys.modules["invoke"]  # anyone else may still import the real Invoke later


_load_paramiko_without_invoke()

if TYPE_CHECKING:
    import paramiko

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


def _quiet_paramiko() -> None:
    """Paramiko logs handshake failures with tracebacks from its reader thread; with no handler
    configured, Python's last-resort handler would print them on stderr beside our own clean
    ConnectError. A NullHandler on its logger keeps them out of the output (layers below ui/ never
    print); a handler the application configures on the root logger (e.g. for --debug) still
    receives them."""
    import logging

    logger = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


class SshTransport:
    """An SSH connection to one host. Build with `SshTransport.handshake()` + `authenticate()`,
    or simply `open_ssh()` (both steps, pinned key enforced)."""

    def __init__(self, host: Host, transport: "paramiko.Transport", where: str,
                 jump: "SshTransport | None", nodelay: bool) -> None:
        self.host = host
        self.host_name = host.name
        self.where = where
        self._t = transport
        self._jump = jump
        self.nodelay = nodelay
        self._authenticated = False
        self._known_hosts_dir: str | None = None
        # What became of the last command an exception abandoned (see run); None: none was.
        self.last_abandoned: str | None = None

    # ---- connecting -----------------------------------------------------------------------

    @classmethod
    def handshake(cls, host: Host, *, jump: "SshTransport | None" = None,
                  nodelay: bool = True, restrict_to_pin: bool = True) -> "SshTransport":
        """TCP connect and SSH key exchange, NO authentication yet: `presented_key` is then known.

        Negotiation is restricted to the pinned key's algorithms when a key is pinned (see
        hostkeys.KEY_ALGORITHMS) unless `restrict_to_pin` is False (`trust --replace` looking at
        a reinstalled host). Raises ConnectError with host, address and reason; closes `jump`
        on failure.
        """
        import paramiko

        _quiet_paramiko()
        where = f"{host.address}:{host.port}" + (f" via {jump.host_name}" if jump else "")
        timeout = host.connect_timeout
        try:
            pinned = pinned_key(host)  # a malformed pin fails here, before any traffic
        except BaseException:
            if jump is not None:
                jump.close()
            raise
        sock: Any
        if jump is None:
            try:
                sock = socket.create_connection((host.address, host.port), timeout=timeout)
            except OSError as exc:
                raise _connect_error(host, where, *_reason_of(exc)) from None
            if nodelay:
                # Paramiko sets no socket options; without this, Nagle + delayed ACK add ~40 ms
                # to every exec on an open connection (ops-notes: 48 ms -> 3 ms).
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            try:
                sock = jump.open_tcp_channel(host.address, host.port, timeout=timeout, purpose="jump")
            except PortClosedError as exc:
                jump.close()  # the jump host answered; the target behind it did not
                raise _connect_error(host, where, exc.message, _reason_of(socket.timeout())[1]
                                     if "no answer" in exc.message else "is sshd running on it?") from None
            except BaseException:
                jump.close()
                raise
        t = paramiko.Transport(sock)
        t.banner_timeout = timeout
        t.handshake_timeout = timeout
        t.auth_timeout = timeout
        if pinned is not None and restrict_to_pin:
            t.get_security_options().key_types = pinned.algorithms
        text = ""
        try:
            t.start_client(timeout=timeout)
            # start_client returns at its timeout WITHOUT raising when the peer has not finished (a
            # listener that accepts and stays silent): the first use then failed as "No existing session".
            text = "" if t.host_key is not None else "timeout"
        except (paramiko.SSHException, OSError, EOFError) as exc:
            text = str(exc) or type(exc).__name__
            if text.startswith("Error reading SSH protocol banner") and isinstance(exc.__context__, socket.timeout):
                text = "timeout"  # Paramiko's banner timeout beat start_client's: the same silent peer
        if text:
            t.close()
            if jump is not None:
                jump.close()
            if "Incompatible ssh" in text or "no acceptable host key" in text:
                hint = (f"the host offers no {pinned.key_type if pinned else ''} host key; "
                        f"if it was reinstalled, verify and run `ddtreectl trust {host.name} --replace`")
            else:
                hint = "is an SSH server listening there? (timeout: connect_timeout in the inventory)"
            reason, hint = _not_ssh(text, host.port, timeout, bool(t.remote_version)) or (
                f"SSH handshake failed: {text}", hint)
            raise _connect_error(host, where, reason, hint) from None
        return cls(host, t, where, jump, nodelay)

    @property
    def presented_key(self) -> PublicKey:
        """The host key the server proved it holds during the key exchange."""
        return PublicKey.from_blob(self._t.get_remote_server_key().asbytes())

    def verify_pinned(self) -> None:
        """Raise HostKeyError unless the presented key equals the one pinned for the host's NAME."""
        check_presented_key(self.host, self.presented_key, address=self.where)

    def authenticate(self, trusted_key: PublicKey) -> "SshTransport":
        """Authenticate, but only if the presented key is `trusted_key` (the caller's decision)."""
        import paramiko

        if self.presented_key != trusted_key:
            self.close()
            raise ConnectError("internal: authenticate() called with a key the host did not present",
                               host=self.host_name)
        try:
            keys = self._identities()
        except BaseException:
            self.close()
            raise
        if not keys:
            self.close()
            raise ConnectError(
                f"no usable private key for {self.host.user}@{self.where}",
                hint="set identity_file for the host (or defaults:) in the inventory",
                host=self.host_name,
            )
        errors: list[str] = []
        for label, key in keys:
            try:
                self._t.auth_publickey(self.host.user, key)
            except paramiko.AuthenticationException as exc:
                errors.append(f"{label}: {exc}")
                continue
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self.close()
                raise _connect_error(self.host, self.where, f"authentication aborted: {exc}",
                                     "check the host's sshd logs") from None
            self._authenticated = True
            return self
        self.close()
        raise AuthenticationError(
            f"authentication as {self.host.user!r} at {self.where} failed ({'; '.join(errors)})",
            hint="check identity_file/user in the inventory and the host's authorized_keys",
            host=self.host_name,
        )

    def _identities(self) -> list[tuple[str, "paramiko.PKey"]]:
        import paramiko

        paths = [self.host.identity_file] if self.host.identity_file else list(DEFAULT_IDENTITIES)
        found: list[tuple[str, paramiko.PKey]] = []
        for raw in paths:
            path = os.path.expanduser(raw)
            if not os.path.exists(path):
                if self.host.identity_file:
                    raise AuthenticationError(f"identity file {raw} does not exist", host=self.host_name,
                                       hint="fix identity_file in the inventory")
                continue
            try:
                found.append((raw, paramiko.PKey.from_path(path)))
            except (paramiko.SSHException, OSError, ValueError) as exc:
                raise AuthenticationError(f"cannot load identity file {raw}: {exc}", host=self.host_name,
                                   hint="only unencrypted keys or an ssh-agent are supported") from None
        if not self.host.identity_file:
            try:
                found += [(f"agent key {k.get_name()}", k) for k in paramiko.Agent().get_keys()]
            except paramiko.SSHException:
                pass
        return found

    # ---- running --------------------------------------------------------------------------

    def _require_authenticated(self) -> None:
        # The trust invariant: nothing but the key exchange happens before the key is accepted.
        if not self._authenticated:
            raise ConnectError("internal: channel requested before the host key was accepted",
                               host=self.host_name)

    def open_tcp_channel(self, address: str, port: int, *, timeout: float, purpose: str) -> Any:
        """A direct-tcpip channel from this host to address:port (jump hosts, HTTP, port checks)."""
        import paramiko

        self._require_authenticated()
        try:
            return self._t.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0),
                                        timeout=timeout)
        except paramiko.ChannelException as exc:
            raise PortClosedError(
                f"{self.host_name} could not open a TCP connection to {address}:{port} "
                f"({purpose}): {exc.text or exc}",
                hint="is anything listening there (as seen from that host)?",
                host=self.host_name,
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if self._t.is_active():  # our link is fine: the far end did not answer in time
                raise PortClosedError(
                    f"{self.host_name} got no answer from {address}:{port} ({purpose}) "
                    f"within {timeout:g} s",
                    hint="is that address up and reachable from this host?",
                    host=self.host_name,
                ) from None
            raise _connect_error(self.host, self.where, f"connection lost: {exc}",
                                 "check the host") from None

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        on_line: Callable[[str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> RunResult:
        import paramiko

        self._require_authenticated()
        limit = self.host.command_timeout if timeout is None else timeout
        started = time.monotonic()
        try:
            chan = self._t.open_session(timeout=self.host.connect_timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _connect_error(self.host, self.where, f"connection lost: {exc}",
                                 "check the host") from None
        err = bytearray()  # shared with _stop_remote, which reads the announced PID from it
        try:
            return self._exec(chan, command, limit, started, stdin, on_line, on_tick, err)
        except BaseException:
            # on_line/on_tick raised (a cancelled deploy) or Ctrl-C/SIGTERM: stop the command on the
            # host, not only our end of it. Closing the channel alone left e.g. a build compiling
            # until its timeout (an hour), holding the workspace lock the next deploy waits on.
            # (A timeout closed the channel already: the remote `timeout` ends it; a lost link
            # reaches nothing, and the remote `timeout` bounds it.)
            if not chan.closed and self._t.is_active():
                self.last_abandoned = self._stop_remote(chan, err, limit)
            chan.close()
            raise

    def _stop_remote(self, chan: Any, err: bytearray, limit: float) -> str:
        """Kill the abandoned command's process group over a second channel of the same connection:
        the wrapper announced the PID that leads it (wrap_command's announce_pid). SIGTERM, then
        SIGKILL for what is left after the wrapper's own grace. (The SSH "signal" request would need
        no PID, but OpenSSH 9.2 on the test hosts did not act on it for a root session.)
        Returns what became of it."""
        pid = announced_pid(chan, err)
        for sig in ("TERM", "KILL"):
            if chan.exit_status_ready():
                return "it was stopped on the host"
            if pid is None:
                break
            try:
                self.run(f"kill -{sig} -- -{pid} 2>/dev/null || kill -{sig} {pid} 2>/dev/null", timeout=10)
            except Exception:  # best effort (the link drops now): the caller's error is the one to show
                break
            end = time.monotonic() + REMOTE_KILL_AFTER_S + 2
            while not chan.status_event.wait(0.2) and time.monotonic() < end:
                while chan.recv_ready():  # a full window must not keep it from dying
                    chan.recv(65536)
        if chan.exit_status_ready():
            return "it was stopped on the host"
        return (f"it could not be confirmed stopped on the host: it ends at its remote timeout "
                f"({remote_timeout_s(limit)} s after it started) at the latest")

    def _exec(self, chan: Any, command: str, limit: float, started: float, stdin: bytes | None,
              on_line: Callable[[str], None] | None, on_tick: Callable[[], None] | None,
              err: bytearray) -> RunResult:
        import paramiko

        deadline = started + limit
        try:
            chan.exec_command(wrap_command(command, limit, announce_pid=True))
            out = bytearray()
            lines = LineSplitter(on_line)

            def drain() -> None:
                # Also while sending input: an unread stdout would stop the remote window and,
                # with it, the command's reading of our input.
                while chan.recv_ready():
                    data = chan.recv(65536)
                    out.extend(data)
                    lines.feed(data)
                while chan.recv_stderr_ready():
                    err.extend(chan.recv_stderr(65536))

            if stdin and not self._send_input(chan, stdin, deadline, drain):
                chan.close()
                raise RemoteCommandError(
                    f"command did not read its {len(stdin)} bytes of input within {limit:g} s: "
                    f"{command[:117]}", host=self.host_name)
            chan.shutdown_write()  # EOF on the command's stdin: nothing ever reads ours
            timed_out = False
            while True:
                drain()
                if on_tick is not None:
                    on_tick()
                if (chan.eof_received or chan.closed) and not (
                        chan.recv_ready() or chan.recv_stderr_ready()):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                select.select([chan], [], [], min(remaining, 1.0))
            if not timed_out:
                timed_out = not chan.status_event.wait(max(0.0, deadline - time.monotonic()))
            if timed_out:
                chan.close()  # the remote `timeout` wrapper kills the process group on its side
                lines.flush()  # as the OpenSSH transport does: a last line without its newline was output too
                raise CommandTimeoutError(
                    f"command timed out after {limit:g} s: {command[:117]}",
                    hint="raise the timeout (command_timeout in the inventory) or check the host",
                    host=self.host_name,
                )
            lines.flush()
            code = chan.recv_exit_status()
            link = chan.get_transport()
            chan.close()
            if code == -1 and (link is None or not link.is_active()):
                # Paramiko reads a connection that dropped mid-command as exit status -1: it was
                # reported as the command failing ("exit -1", no message), e.g. a `systemctl start`
                # that had in fact reached systemd, and restore-service said nothing was started.
                raise EOFError("the connection closed before the command's exit status arrived")
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise _connect_error(self.host, self.where, f"connection lost: {exc}",
                                 "check the host; the command may or may not have run") from None
        return RunResult(command=command, exit_code=code, stdout=out.decode("utf-8", "replace"),
                         stderr=strip_pid_line(err.decode("utf-8", "replace")),
                         duration_s=time.monotonic() - started)

    @staticmethod
    def _send_input(chan: Any, data: bytes, deadline: float, drain: Callable[[], None]) -> bool:
        """Send `data` to the command's stdin before `deadline`; False if the deadline passed.

        Chunked with short waits, not one sendall(): sshd keeps opening the window while it
        buffers, so a sendall() timeout would not bound the total; and between chunks `drain`
        reads output, else a command echoing its input (`cat`) would stall both directions. A command that exits without reading all of it is not an error here (its exit status and
        output say what happened), as with a local pipe.
        """
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            drain()
            chan.settimeout(min(remaining, 0.05))
            try:
                sent = chan.send(view[:65536])
            except socket.timeout:
                continue  # window closed for now: drain output, check the deadline, retry
            except OSError:
                if chan.closed or chan.eof_received or chan.exit_status_ready():
                    break
                raise
            if sent == 0:
                break
            view = view[sent:]
        chan.settimeout(None)
        return True

    def http_get(self, port: int, path: str, *, timeout: float) -> HttpResponse:
        chan = self.open_tcp_channel("127.0.0.1", port, timeout=timeout, purpose="HTTP")
        try:
            return http_wire.exchange(chan, port, path, timeout=timeout, host=self.host_name)
        finally:
            chan.close()

    def port_open(self, port: int, *, timeout: float) -> bool:
        try:
            self.open_tcp_channel("127.0.0.1", port, timeout=timeout, purpose="port check").close()
        except PortClosedError:
            return False
        return True

    # ---- rsync ----------------------------------------------------------------------------

    def rsync_ssh_command(self) -> list[str]:
        """OpenSSH argv for `rsync -e` (join with shlex.join) that pins the keys by host NAME
        (see openssh.py); its private known_hosts file is removed on close()."""
        if self._known_hosts_dir is None:
            self._known_hosts_dir = tempfile.mkdtemp(prefix="ddtreectl-kh-")
        known_hosts = os.path.join(self._known_hosts_dir, "known_hosts")
        hops: list[openssh.Hop] = []
        node: SshTransport | None = self
        while node is not None:
            hops.insert(0, (node.host, node.presented_key))  # verified against the pin already
            node = node._jump
        openssh.write_known_hosts(known_hosts, hops)
        return openssh.ssh_argv(hops, known_hosts)

    def rsync_destination(self, path: str) -> str:
        address = f"[{self.host.address}]" if ":" in self.host.address else self.host.address
        return f"{self.host.user}@{address}:{path}"

    # ---- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        self._t.close()
        if self._jump is not None:
            self._jump.close()
        if self._known_hosts_dir is not None:
            for name in os.listdir(self._known_hosts_dir):
                os.unlink(os.path.join(self._known_hosts_dir, name))
            os.rmdir(self._known_hosts_dir)
            self._known_hosts_dir = None

    def __enter__(self) -> "SshTransport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_ssh(host: Host, *, jump: SshTransport | None = None, nodelay: bool = True) -> SshTransport:
    """Connect, refuse unless the presented key is the one pinned for host.name, authenticate."""
    t = SshTransport.handshake(host, jump=jump, nodelay=nodelay)
    try:
        t.verify_pinned()
    except BaseException:
        t.close()
        raise
    return t.authenticate(t.presented_key)
