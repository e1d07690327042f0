"""A throwaway OpenSSH server on 127.0.0.1 for transport tests that need no full test host.

Real sshd (its own config, host key and authorized key in a temp dir, a free high port); the
caller kills it by the PID it gets back (the `start_sshd` fixture does, at teardown). It runs in its own mount namespace so a test can bind
an empty file over /root/.bashrc (the machine's own one runs `pyenv init`) without touching the
machine's files; `clean_rc=False` keeps the real one, to measure what a heavy rc file costs.
The full test hosts (systemd + sshd in namespaces) are tests/testbed's fixture.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ddtreectl.inventory.models import Host

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path, kind: str = "ed25519") -> str:
    """Create a key pair at `path`; return the public key line without comment."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@dataclass
class LocalSshd:
    pid: int
    port: int
    dir: Path
    host_key: str  # pinned form of the server's key
    client_key: Path

    def host(self, name: str = "sshd", *, pinned: str | None = "same", **kw: object) -> Host:
        """A Host entry for this server; pinned='same' pins its real key, None pins nothing."""
        key = self.host_key if pinned == "same" else pinned
        base = Host(name=name, address="127.0.0.1", port=self.port, user="root",
                    identity_file=str(self.client_key), host_key=key, connect_timeout=3.0,
                    command_timeout=20.0)
        return replace(base, **kw)  # type: ignore[arg-type]


def launch_sshd(d: Path, *, clean_rc: bool = True, key_type: str = "ed25519",
                extra_keys: tuple[str, ...] = ()) -> tuple["subprocess.Popen[bytes]", LocalSshd]:
    """Start sshd with its files in the (new, empty) directory `d`; the caller kills the Popen."""
    d.mkdir()
    host_key = keygen(d / "host_key", key_type)
    host_key_lines = [f"HostKey {d / 'host_key'}"]
    for i, kind in enumerate(extra_keys):
        keygen(d / f"extra{i}", kind)
        host_key_lines.append(f"HostKey {d / f'extra{i}'}")
    keygen(d / "client_key")
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "empty_rc").write_text("")
    port = _free_port()
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", *host_key_lines,
        f"AuthorizedKeysFile {d / 'authorized_keys'}", "StrictModes no", "UsePAM no",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "UseDNS no",
        f"PidFile {d / 'sshd.pid'}", "LogLevel ERROR", "",
    ]))
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory
    rc = f"mount --bind {d / 'empty_rc'} /root/.bashrc && " if clean_rc and os.path.exists("/root/.bashrc") else ""
    # unshare and sh exec into sshd: the PID we hold is sshd's own.
    proc = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
         f"{rc}exec {SSHD} -D -e -f {d / 'sshd_config'}"],
        stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "wb"),
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"sshd did not start: {(d / 'sshd.log').read_text()}")
        time.sleep(0.02)
    return proc, LocalSshd(proc.pid, port, d, host_key, d / "client_key")
