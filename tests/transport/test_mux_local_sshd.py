"""MuxTransport (OpenSSH with ControlMaster/ControlPersist) against a real sshd on 127.0.0.1.

The same contract as SshTransport (exit codes, stdin, streaming, timeouts) and the same verdicts:
every failure is compared with what the Paramiko path says for the same server. Each test has its
own control directory (tests/conftest.py: ssh_control_dir); masters are observed with `ssh -O check`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from ddtreectl.errors import ConnectError, HostKeyError, RemoteCommandError
from ddtreectl.inventory.models import Host
from ddtreectl.operations.status import gather_status
from ddtreectl.transport import connect, control
from ddtreectl.transport.mux import MuxTransport, open_mux
from ddtreectl.transport.ssh import SshTransport, open_ssh
from tests.transport.sshd import LocalSshd, keygen

Start = Callable[..., LocalSshd]
REPO = Path(__file__).resolve().parents[2]


def mux(host: Host) -> MuxTransport:
    t = open_mux(host, None)
    assert isinstance(t, MuxTransport), "reuse should be possible here"
    return t


def paramiko_error(host: Host) -> ConnectError:
    with pytest.raises(ConnectError) as err:
        open_ssh(host)
    return err.value


def test_run_contract_through_a_master_that_outlives_the_transport(start_sshd: Start) -> None:
    host = start_sshd().host()
    with mux(host) as t:
        r = t.run("printf 'a\\nb'; printf oops >&2; exit 7")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "a\nb", "oops")  # our start marker is not in it
        # 255 is the command's own status here, not a connection failure (no Paramiko retry).
        r = t.run("echo ran; exit 255")
        assert (r.exit_code, r.stdout, t.via_paramiko) == (255, "ran\n", False)
        data = os.urandom(500_000)
        assert t.run("sha256sum", stdin=data).stdout.split()[0] == hashlib.sha256(data).hexdigest()
        assert t.run("cat", timeout=5).stdout == ""  # stdin at EOF
        lines: list[str] = []
        t.run("for i in 1 2 3; do echo line$i; done; printf tail", on_line=lines.append)
        assert lines == ["line1", "line2", "line3", "tail"]
        assert t.run("echo \"$0\"; set -- 'a b' c; echo $#").stdout == "/bin/sh\n2\n"
        pid = control.master_pid(t.control_path)
        assert pid is not None
    # Closing the transport leaves the master up (ControlPersist); the next one uses it.
    assert control.master_pid(t.control_path) == pid
    with mux(host) as again:
        assert again.control_path == t.control_path and again.run("true").ok
    assert control.master_pid(t.control_path) == pid
    assert control.close_master(t.control_path) and control.master_pid(t.control_path) is None


def test_timeout_kills_the_client_not_the_master(start_sshd: Start) -> None:
    with mux(start_sshd().host()) as t:
        assert t.run("true").ok
        pid = control.master_pid(t.control_path)
        with pytest.raises(RemoteCommandError, match="timed out after 1 s"):
            t.run("sleep 30", timeout=1)
        assert control.master_pid(t.control_path) == pid
        assert t.run("echo still").stdout == "still\n"


def test_wrong_pin_is_refused_in_paramikos_words(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    other = keygen(tmp_path / "other")
    host = sshd.host(pinned=other)
    with pytest.raises(HostKeyError) as err:
        mux(host).run("true")
    assert str(err.value) == str(paramiko_error(host)) and err.value.hint == paramiko_error(host).hint
    assert "HOST KEY MISMATCH" in err.value.message
    assert control.master_pid(control.control_path(host) or "") is None


def test_unpinned_host_takes_the_paramiko_path_with_the_trust_hint(start_sshd: Start) -> None:
    host = start_sshd().host(pinned=None)
    assert open_mux(host, None) is None
    with pytest.raises(HostKeyError, match="not trusted yet") as err:
        connect(host, reuse=True)
    assert err.value.hint and "ddtreectl trust sshd" in err.value.hint


def test_refused_port_is_classified_from_ssh_without_paramiko(start_sshd: Start) -> None:
    sshd = start_sshd()
    os.kill(sshd.pid, 9)
    time.sleep(0.1)
    host = sshd.host()
    expected = paramiko_error(host)
    # In a fresh interpreter: the verdict comes from ssh's own words, Paramiko is never imported.
    code = (
        "import sys\n"
        "from ddtreectl.transport.mux import open_mux\n"
        "from ddtreectl.errors import ConnectError\n"
        f"host = __import__('pickle').loads({__import__('pickle').dumps(host)!r})\n"
        "try:\n    open_mux(host, None).run('true')\n"
        "except ConnectError as e:\n    print(type(e).__name__, '|', e, '|', e.hint)\n"
        "print('paramiko' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"ConnectError | {expected} | {expected.hint}", "False"]


def test_authentication_failure_is_paramikos_verdict(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    keygen(tmp_path / "stranger")
    host = sshd.host(identity_file=str(tmp_path / "stranger"))
    with pytest.raises(ConnectError) as err:
        mux(host).run("true")
    assert str(err.value) == str(paramiko_error(host))
    assert "authentication as 'root'" in err.value.message


def test_pin_not_among_the_reported_keys_closes_the_master(start_sshd: Start) -> None:
    sshd = start_sshd()
    with mux(sshd.host()) as t:
        assert t.run("true").ok
        assert t.confirm_host_keys(["ssh-rsa AAAA-not-a-key", sshd.host_key + " root@x"]) is True
        assert control.master_pid(t.control_path) is not None
        # This sshd keeps its key outside /etc/ssh: a probe cannot confirm the pin. The master is
        # closed and Paramiko verifies the host afresh (it passes: the key did not change).
        assert t.confirm_host_keys([]) is False
        assert control.master_pid(t.control_path) is None and t.via_paramiko
        assert t.run("echo via paramiko").stdout == "via paramiko\n"


def test_sshd_without_a_listener_closes_the_master(start_sshd: Start) -> None:
    """What the probe saw of sshd's listener: unknown or listening keeps the master; not listening
    closes it, and the fresh connection decides (here sshd still runs, so Paramiko gets in; on a
    host whose sshd stopped it is refused: tests/e2e/test_status_reuse.py)."""
    sshd = start_sshd()
    with mux(sshd.host()) as t:
        assert t.run("true").ok
        assert t.confirm_sshd_listening(None) is True and t.confirm_sshd_listening(True) is True
        assert control.master_pid(t.control_path) is not None and not t.via_paramiko
        assert t.confirm_sshd_listening(False) is False
        assert control.master_pid(t.control_path) is None and t.via_paramiko
        assert t.run("echo via paramiko").stdout == "via paramiko\n"
        assert t.confirm_sshd_listening(False) is True  # already a fresh connection


def test_status_of_a_host_whose_keys_the_probe_cannot_see(start_sshd: Start, tmp_path: Path) -> None:
    """gather_status end to end on that host: answered, through Paramiko after the master."""
    from ddtreectl.inventory.loader import parse

    sshd = start_sshd()
    inv = parse(f"hosts:\n  s:\n    address: 127.0.0.1\n    port: {sshd.port}\n"
                f"    identity_file: {sshd.client_key}\n    host_key: {sshd.host_key}\n"
                "    remote_root: /nonexistent-ddtree\n", tmp_path / "hosts.yaml")
    report = gather_status(inv, [inv.host("s")], deadline_s=20)
    (s,) = report.hosts
    assert (s.outcome, s.connection) == ("ok", "paramiko"), s.error
    assert s.facts is not None and s.facts.host_keys is not None


def test_rsync_rides_on_the_master(start_sshd: Start, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(100_000))
    with mux(start_sshd().host()) as t:
        assert t.run("true").ok
        dest = tmp_path / "dest"
        subprocess.run(["rsync", "-a", "-e", shlex.join(t.rsync_ssh_command()), f"{src}/",
                        t.rsync_destination(str(dest))], check=True, timeout=60)
        assert (dest / "f.bin").read_bytes() == (src / "f.bin").read_bytes()


def test_no_reuse_when_the_control_dir_is_unsafe_or_off(start_sshd: Start, tmp_path: Path, ssh_control_dir: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    host = start_sshd().host()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    os.chown(foreign, 65534, 65534)  # not ours: someone else could swap the sockets
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(foreign))
    assert open_mux(host, None) is None
    assert isinstance(connect(host, reuse=True), SshTransport)
    loose = Path(ssh_control_dir) / "l"  # short: tmp_path would be past the socket path limit
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(loose))
    assert control.control_dir() == str(loose) and os.stat(loose).st_mode & 0o777 == 0o700
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(tmp_path / ("x" * 100)))
    assert open_mux(host, None) is None  # a socket path past sun_path's 108 bytes
    monkeypatch.setenv(control.ENV_CONTROL_DIR, str(loose))
    for off in ("0", "no", "False", "off"):
        monkeypatch.setenv(control.ENV_REUSE, off)
        assert open_mux(host, None) is None
    monkeypatch.setenv(control.ENV_REUSE, "1")
    assert open_mux(host, None) is not None


def test_control_key_follows_everything_the_connection_depends_on(tmp_path: Path) -> None:
    pin = keygen(tmp_path / "k1")
    base = Host(name="a", address="10.0.0.1", host_key=pin)
    key = control.control_key(base)
    changes = {"name": "b", "address": "10.0.0.2", "port": 2222, "user": "ops",
               "identity_file": "/id", "host_key": keygen(tmp_path / "k2")}
    for field, value in changes.items():
        assert control.control_key(dataclasses.replace(base, **{field: value})) != key, field
    assert control.control_key(dataclasses.replace(base, command_timeout=5)) == key


@pytest.mark.parametrize("stderr, reason", [
    ("ssh: connect to host 10.200.1.9 port 22: Connection refused\r\n", "connection refused"),
    ("ssh: connect to host 10.200.1.9 port 22: Connection timed out\r\n", "connection timed out"),
    ("Connection timed out during banner exchange\r\nConnection to 10.200.1.9 port 22 timed out\r\n",
     "connection timed out"),
    ("ssh: connect to host 10.200.1.9 port 22: No route to host\r\n", "no route to host"),
    ("ssh: connect to host 10.200.1.9 port 22: Network is unreachable\r\n", "network is unreachable"),
    ("ssh: Could not resolve hostname ct9: Name or service not known\r\n",
     "cannot resolve address (Name or service not known)"),
    ("Host key verification failed.\r\n", None),
    ("root@10.200.1.9: Permission denied (publickey).\r\n", None),
    ("kex_exchange_identification: read: Connection reset by peer\r\n", None),
])
def test_classify_only_unambiguous_ssh_failures(stderr: str, reason: str | None) -> None:
    got = MuxTransport._classify(stderr)
    assert (got[0] if got else None) == reason


def test_prune_removes_only_long_unused_known_hosts_of_gone_masters(tmp_path: Path) -> None:
    import socket as socketlib

    d = tmp_path / "cm"
    d.mkdir()
    old = time.time() - 2 * control.PRUNE_AFTER_S
    for name in ("gone", "live", "recent"):
        (d / f"{name}.known_hosts").write_text("x\n")
    os.utime(d / "gone.known_hosts", (old, old))
    os.utime(d / "live.known_hosts", (old, old))
    with socketlib.socket(socketlib.AF_UNIX) as listener:
        listener.bind(str(d / "live"))  # a master socket is there: its file stays
        assert control.prune_known_hosts(str(d)) == 1
        assert control.prune_known_hosts(str(d)) == 0  # once per directory per process
    assert sorted(p.name for p in d.iterdir() if p.name.endswith(".known_hosts")) == [
        "live.known_hosts", "recent.known_hosts"]
