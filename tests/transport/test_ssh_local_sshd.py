"""SshTransport against a real, throwaway OpenSSH server on 127.0.0.1 (see conftest.py).

The same behaviours run against full systemd test hosts in test_ssh_testbed.py; this file needs
only sshd, so it also runs where namespaces are unavailable.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from ddtreectl.errors import ConnectError, ExitCode, HostKeyError, RemoteCommandError
from ddtreectl.inventory.models import Host, Inventory
from ddtreectl.transport import connect
from ddtreectl.transport.base import PortClosedError
from ddtreectl.transport.hostkeys import PublicKey
from ddtreectl.transport.ssh import SshTransport, open_ssh

from tests.transport.sshd import LocalSshd, keygen

Start = Callable[..., LocalSshd]


def test_run_exit_codes_stdin_and_streaming(start_sshd: Start) -> None:
    with open_ssh(start_sshd().host()) as t:
        r = t.run("printf 'a\\nb'; printf oops >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "a\nb", "oops")
        data = os.urandom(500_000)
        assert t.run("sha256sum", stdin=data).stdout.split()[0] == hashlib.sha256(data).hexdigest()
        assert t.run("cat", timeout=5).stdout == ""  # stdin is at EOF, never our terminal
        # Input and output both far beyond the SSH windows: no stall in either direction.
        big = b"0123456789abcde\n" * 1_000_000
        r = t.run("cat; cat /dev/null >&2", stdin=big, timeout=60)
        assert r.ok and len(r.stdout) == len(big) and r.stdout.encode() == big
        lines: list[str] = []
        r = t.run("for i in 1 2 3; do echo line$i; done; printf tail", on_line=lines.append)
        assert lines == ["line1", "line2", "line3", "tail"]
        # The command runs under /bin/sh with its quoting intact, whatever the login shell is.
        assert t.run("echo \"$0\"; set -- 'a b' c; echo $#").stdout == "/bin/sh\n2\n"


def test_big_quote_heavy_script_fits_one_exec(start_sshd: Start) -> None:
    # 4,000 quote-heavy words (~28 KB): quoting it twice (nested) would make ~580 KB, far past
    # Linux's 128 KiB single-argument limit; quoted once it is ~96 KB.
    words = ["'it''s'"] * 4_000
    script = "set -- " + " ".join(words) + "\necho $#\necho \"$1\""
    with open_ssh(start_sshd().host()) as t:
        r = t.run(script)
        assert (r.exit_code, r.stdout) == (0, "4000\nits\n"), r.stderr


def test_timeout_raises_and_the_remote_process_group_dies(start_sshd: Start) -> None:
    sshd = start_sshd()
    pidfile = sshd.dir / "sleep.pid"
    with open_ssh(sshd.host()) as t:
        with pytest.raises(RemoteCommandError, match="timed out after 1 s"):
            t.run(f"sh -c 'echo $$ > {pidfile}; exec sleep 60' & wait", timeout=1)
        pid = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pid}"), "remote sleep survived the timeout"
        assert t.run("echo still usable").stdout == "still usable\n"


class _Cancelled(Exception):
    pass


@pytest.mark.parametrize("stop", [_Cancelled, KeyboardInterrupt])
def test_an_abandoned_command_is_stopped_on_the_host(start_sshd: Start, stop: type[BaseException]) -> None:
    """What deploy's Ctrl-C relies on: a compile step that prints nothing is still abandoned (without
    on_tick this run would sit out the whole minute), and abandoning it stops it ON THE HOST, children
    included. Closing the channel alone left it running until its `timeout` wrapper fired (a build: an
    hour, holding the workspace lock the next deploy then waited on). Its process group is killed over
    a second channel of the same connection, which stays usable, and the transport says so."""
    sshd = start_sshd()
    pidfile = sshd.dir / "quiet.pid"
    calls = []

    def on_tick() -> None:
        calls.append(1)
        if pidfile.exists() and len(calls) >= 2:
            raise stop

    with open_ssh(sshd.host()) as t:
        with pytest.raises(stop):
            t.run(f"sh -c 'echo $$ > {pidfile}; exec sleep 60' & sleep 61", timeout=120, on_tick=on_tick)
        assert t.last_abandoned == "it was stopped on the host"
        child = int(pidfile.read_text())
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{child}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{child}"), "the abandoned command's child survived"
        done = t.run("echo still usable; echo err >&2")
        assert (done.stdout, done.stderr) == ("still usable\n", "err\n")  # the PID announcement is not output


def test_input_the_command_never_reads_cannot_block_past_the_timeout(start_sshd: Start) -> None:
    with open_ssh(start_sshd().host()) as t:
        t0 = time.monotonic()
        with pytest.raises(RemoteCommandError, match="did not read its"):
            t.run("sleep 30", stdin=b"x" * 64_000_000, timeout=1)
        assert time.monotonic() - t0 < 20


def test_pinned_key_accepted(start_sshd: Start) -> None:
    sshd = start_sshd()
    with open_ssh(sshd.host()) as t:
        assert t.presented_key == PublicKey.parse(sshd.host_key)


def test_unknown_key_refused_before_authenticating(start_sshd: Start) -> None:
    sshd = start_sshd()
    host = sshd.host(pinned=None, identity_file="/nonexistent")  # auth would fail if attempted
    with pytest.raises(HostKeyError) as err:
        open_ssh(host)
    fp = PublicKey.parse(sshd.host_key).fingerprint
    assert fp in err.value.message and f"127.0.0.1:{sshd.port}" in err.value.message
    assert err.value.hint is not None and "ddtreectl trust sshd" in err.value.hint
    assert err.value.exit_code == ExitCode.CONNECTION


def test_mismatch_refused_with_both_fingerprints(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    other = keygen(tmp_path / "other")
    with pytest.raises(HostKeyError) as err:
        open_ssh(sshd.host(pinned=other))
    msg = err.value.message
    assert PublicKey.parse(other).fingerprint in msg
    assert PublicKey.parse(sshd.host_key).fingerprint in msg


def test_negotiation_is_restricted_to_the_pinned_key_type(start_sshd: Start) -> None:
    # The server holds an ECDSA key first and an ed25519 key too; pinned RSA/ed25519 must each win.
    sshd = start_sshd(key_type="ecdsa", extra_keys=("ed25519", "rsa"))
    ed = " ".join((sshd.dir / "extra0.pub").read_text().split()[:2])
    rsa = " ".join((sshd.dir / "extra1.pub").read_text().split()[:2])
    for pin in (ed, rsa, sshd.host_key):
        with open_ssh(sshd.host(pinned=pin)) as t:
            assert t.presented_key.line == pin


def test_refused_port_is_a_quick_connect_error(start_sshd: Start) -> None:
    sshd = start_sshd()
    os.kill(sshd.pid, 9)
    time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(ConnectError) as err:
        open_ssh(sshd.host())
    assert time.monotonic() - t0 < 3  # refused, not a connect timeout (3 s here)
    assert "connection refused" in err.value.message and f"127.0.0.1:{sshd.port}" in err.value.message
    assert err.value.hint and not isinstance(err.value, HostKeyError)


def test_auth_failure_is_a_connect_error(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    keygen(tmp_path / "stranger")
    with pytest.raises(ConnectError, match="authentication as 'root'") as err:
        open_ssh(sshd.host(identity_file=str(tmp_path / "stranger")))
    assert err.value.exit_code == ExitCode.CONNECTION and "authorized_keys" in (err.value.hint or "")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_http_get_and_port_open_through_the_channel(start_sshd: Start) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with open_ssh(start_sshd().host()) as t:
        try:
            resp = t.http_get(port, "/v1/models", timeout=5)
            assert (resp.status, resp.body, resp.headers["content-type"]) == (
                200, b'{"ok": true}', "application/json")
            assert t.port_open(port, timeout=3)
        finally:
            server.shutdown()
            server.server_close()
        assert not t.port_open(port, timeout=3)
        with pytest.raises(PortClosedError, match=f"127.0.0.1:{port}"):
            t.http_get(port, "/health", timeout=3)


def test_rsync_with_the_pinned_ssh_command(start_sshd: Start, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(100_000))
    with open_ssh(start_sshd().host()) as t:
        argv = t.rsync_ssh_command()
        kh = next(a.split("=", 1)[1] for a in argv if a.startswith("UserKnownHostsFile="))
        assert os.stat(kh).st_mode & 0o777 == 0o600
        dest = tmp_path / "dest"
        subprocess.run(["rsync", "-a", "-e", shlex.join(argv), f"{src}/",
                        t.rsync_destination(str(dest))], check=True, timeout=60)
        assert (dest / "f.bin").read_bytes() == (src / "f.bin").read_bytes()
    assert not os.path.exists(kh)  # removed on close


def test_rsync_ssh_command_refuses_a_different_key(start_sshd: Start, tmp_path: Path) -> None:
    a, b = start_sshd(), start_sshd()
    with open_ssh(a.host()) as t:
        argv = t.rsync_ssh_command()
        # Same alias and known_hosts, other server (as if another box took the address).
        port = argv.index("-p")
        argv[port + 1] = str(b.port)
        out = subprocess.run(argv + ["127.0.0.1", "true"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in out.stderr


def test_jump_host_with_both_keys_pinned(start_sshd: Start, tmp_path: Path) -> None:
    jump, target = start_sshd(), start_sshd()
    inv = Inventory(path=tmp_path / "hosts.yaml",
                    hosts={"a": jump.host("a"), "b": target.host("b", jump_host="a")},
                    groups={}, services={})
    with connect(inv.hosts["b"], inv) as t:
        assert isinstance(t, SshTransport)
        # SSH_CONNECTION = "client_ip client_port server_ip server_port": the target's sshd served us.
        assert t.run("echo $SSH_CONNECTION").stdout.split()[2:] == ["127.0.0.1", str(target.port)]
        dest = tmp_path / "via-jump"
        subprocess.run(["rsync", "-a", "-e", shlex.join(t.rsync_ssh_command()), str(jump.dir / "sshd_config"),
                        t.rsync_destination(str(dest))], check=True, timeout=60)
        assert dest.read_text() == (jump.dir / "sshd_config").read_text()
    bad = {"a": jump.host("a", pinned=target.host_key), "b": inv.hosts["b"]}
    with pytest.raises(HostKeyError) as err:
        connect(bad["b"], Inventory(inv.path, bad, {}, {}))
    assert err.value.host == "a"  # the jump host's own pin is enforced


def test_login_shell_rc_is_sourced(start_sshd: Start) -> None:
    """Documents a measured fact (module docstring): bash sources ~/.bashrc for every exec."""
    rc = Path("/root/.bashrc")
    if not rc.exists() or "PYENV_ROOT" not in rc.read_text():
        pytest.skip("this machine's /root/.bashrc does not set PYENV_ROOT")
    heavy = start_sshd(clean_rc=False)
    with open_ssh(heavy.host()) as t:
        assert t.run("echo ${PYENV_ROOT-unset}").stdout.strip() != "unset"
        heavy_s = min(t.run("true").duration_s for _ in range(5))
    with open_ssh(start_sshd(clean_rc=True).host()) as t:
        assert t.run("echo ${PYENV_ROOT-unset}").stdout.strip() == "unset"
        clean_s = min(t.run("true").duration_s for _ in range(5))
    print(f"\nwarm exec: heavy ~/.bashrc {heavy_s * 1e3:.1f} ms, clean {clean_s * 1e3:.1f} ms "
          f"(ratio {heavy_s / clean_s:.1f}x)")


def test_latency_connect_and_warm_exec_with_and_without_nodelay(start_sshd: Start) -> None:
    """Prints (never asserts) connect and warm-exec latency; TCP_NODELAY vs Paramiko's default."""
    sshd = start_sshd()
    report = []
    for nodelay in (True, False):
        t0 = time.monotonic()
        t = open_ssh(sshd.host(), nodelay=nodelay)
        connect_s = time.monotonic() - t0
        t.run("true")
        samples = sorted(t.run("true").duration_s for _ in range(20))
        t.close()
        report.append((nodelay, connect_s, samples[len(samples) // 2]))
    print()
    for nodelay, connect_s, median in report:
        print(f"TCP_NODELAY={nodelay!s:5}: connect+auth {connect_s * 1e3:6.1f} ms, "
              f"warm exec median {median * 1e3:6.1f} ms")
    print(f"warm exec without/with TCP_NODELAY: {report[1][2] / report[0][2]:.1f}x")


@pytest.mark.parametrize(("answer", "reason"), [
    (b"HTTP/1.1 400 Bad Request\r\n\r\n", "something answered on port {port} but closed the connection without an "
                                         "SSH greeting"),
    (b"", "something answered on port {port} but closed the connection without an SSH greeting"),
    (b"hello\r\n" * 120, "port {port} answered \"hello\" instead of an SSH greeting"),
    (None, "port {port} accepted the connection but sent no SSH greeting in 1 s"),
])
def test_not_an_ssh_server_is_a_clean_connect_error(answer: bytes | None, reason: str,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """Whatever answers on the port without speaking SSH (a web server, a closed-at-once socket, chatter,
    a silent listener) is said in words with what to check. It was Paramiko's "SSH handshake failed:
    Error reading SSH protocol banner"; a silent listener even escaped as a bare "No existing session"."""
    import socket as socket_mod

    srv = socket_mod.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    held = []

    def serve() -> None:
        conn, _ = srv.accept()
        if answer is None:
            held.append(conn)  # accepted and silent until the client gives up
            return
        conn.sendall(answer)
        if len(answer) > 100:
            time.sleep(3)  # Paramiko reads 100 lines before it calls the version indecipherable
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        with pytest.raises(ConnectError, match="no SSH server there") as err:
            open_ssh(Host(name="web", address="127.0.0.1", port=port, connect_timeout=1))
    finally:
        srv.close()
        for conn in held:
            conn.close()
    assert err.value.host == "web" and f"127.0.0.1:{port}" in err.value.message
    assert reason.format(port=port) in err.value.message, err.value.message
    assert err.value.hint and err.value.hint.startswith(f"wrong port or address? check `address:` and `port:` ({port})")
    time.sleep(0.2)  # Paramiko's reader thread logs after the failure; it must stay silent
    assert capfd.readouterr().err == ""


def test_a_silent_listener_reads_the_same_whichever_timeout_fires_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paramiko's banner read and start_client's wait share connect_timeout: when the banner read fires
    first it raises "Error reading SSH protocol banner" (a timeout underneath), which must still read as
    a silent peer, never as one that closed the connection."""
    import socket as socket_mod

    import paramiko

    start_client = paramiko.Transport.start_client
    monkeypatch.setattr(paramiko.Transport, "start_client",
                        lambda self, event=None, timeout=None: start_client(self, event, timeout=(timeout or 0) + 2))
    srv = socket_mod.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()  # accepted by the kernel's backlog, never answered
    port = srv.getsockname()[1]
    try:
        with pytest.raises(ConnectError, match=f"port {port} accepted the connection but sent no SSH greeting in 1 s"):
            open_ssh(Host(name="web", address="127.0.0.1", port=port, connect_timeout=1))
    finally:
        srv.close()


def test_nothing_runs_before_the_key_is_accepted(start_sshd: Start) -> None:
    sshd = start_sshd()
    with SshTransport.handshake(sshd.host(pinned=None)) as session:
        assert session.presented_key.line == sshd.host_key
        with pytest.raises(ConnectError, match="before the host key was accepted"):
            session.run("true")
        with pytest.raises(ConnectError, match="before the host key was accepted"):
            session.port_open(22, timeout=1)
