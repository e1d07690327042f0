"""One booted test host, seen from the runner: run commands in it, edit its files, move it."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

# Commands entering a host get a clean environment, not pytest's (pyenv PATH, PYTHONPATH, ...).
HOST_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "USER": "root",
    "LOGNAME": "root",
    "TERM": "dumb",
    "SYSTEMD_PAGER": "",
}


@dataclass
class TestHost:
    """A running host: systemd as PID 1, sshd on port 22 of `address`."""

    __test__ = False  # not a pytest test class

    name: str
    address: str
    init_pid: int
    machine_id: str
    host_key: str  # "ssh-ed25519 AAAA..." (the pinned public key line)
    index: int  # slot-local host number (veth name, address)
    cgroup: Path
    hostdir: Path
    vlan_gateway: str
    gateway: str
    launcher: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def root(self) -> Path:
        """The host's `/` as the runner sees it: read and write host files through this."""
        return Path(f"/proc/{self.init_pid}/root")

    @property
    def console_log(self) -> Path:
        return self.hostdir / "console.log"

    # --- commands --------------------------------------------------------------------------

    def sh(self, command: str, *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `/bin/sh -c command` as root inside the host's namespaces (not over SSH)."""
        proc = subprocess.run(
            ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-i", "-n", "-p", "--",
             "/bin/sh", "-c", command],
            capture_output=True, text=True, timeout=timeout, env=HOST_ENV, cwd="/",
        )
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, f"[{self.name}] {command}",
                                                proc.stdout, proc.stderr)
        return proc

    def systemctl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`systemctl ARGS` inside the host."""
        import shlex

        return self.sh("systemctl --no-pager " + " ".join(shlex.quote(a) for a in args),
                       check=check, timeout=timeout)

    def journal(self, unit: str | None = None, lines: int = 50) -> str:
        """The last `lines` journal lines of the host (or of one unit). Works on a wedged host too."""
        args = ["journalctl", "--no-pager", "-q", "-o", "short-monotonic", "-n", str(lines),
                "-D", str(self.root / "run/log/journal" / self.machine_id)]
        if unit:
            args += ["-u", unit]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=30)
        return proc.stdout + proc.stderr

    # --- files -----------------------------------------------------------------------------

    def write_file(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        """Atomically write a file inside the host (parents created 0755), through /proc/PID/root."""
        if not path.startswith("/"):
            raise ValueError(f"host path must be absolute: {path!r}")
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            os.write(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, target)

    def read_file(self, path: str) -> str:
        return (self.root / path.lstrip("/")).read_text()

    def install_nvidia_smi_stub(self, script: str) -> None:
        """An executable /usr/local/bin/nvidia-smi in the host (GPU tests on GPU-less hosts)."""
        self.write_file("/usr/local/bin/nvidia-smi", script, 0o755)

    # --- network and sshd ------------------------------------------------------------------

    def move_address(self, new: str) -> None:
        """Move the host to `new` (a Fleet.new_address()) like a VLAN change: add, delete, re-route.

        sshd listens on the wildcard address, so it keeps serving with the same host key.
        """
        gateway = self.vlan_gateway if new.split(".")[1] == self.vlan_gateway.split(".")[1] else self.gateway
        self.sh(f"ip addr add {new}/16 dev eth0 && ip addr del {self.address}/16 dev eth0"
                f" && ip route replace default via {gateway}")
        self.address = new

    def stop_sshd(self) -> None:
        """Stop sshd (the host stays up); port 22 then refuses connections."""
        self.systemctl("stop", "ssh.service")

    def start_sshd(self) -> None:
        """Start sshd again; returns once port 22 shows the SSH banner."""
        self.systemctl("start", "ssh.service")
        self.wait_ssh_banner()

    def wait_ssh_banner(self, timeout: float = 15) -> str:
        """Block until port 22 of `address` sends an SSH banner; returns it (TimeoutError if never)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((self.address, 22), timeout=1) as sock:
                    sock.settimeout(1)
                    data = sock.recv(256)
                    if data.startswith(b"SSH-"):
                        return data.decode(errors="replace").strip()
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: no SSH banner on {self.address}:22 within {timeout}s")
            time.sleep(0.02)

    def regenerate_host_key(self) -> str:
        """Replace the host's ed25519 key and reload sshd; returns (and records) the new public key.

        sshd re-executes itself on reload (port 22 refuses for a moment): this returns once it
        answers again."""
        self.sh("rm -f /etc/ssh/ssh_host_ed25519_key /etc/ssh/ssh_host_ed25519_key.pub"
                f" && ssh-keygen -q -t ed25519 -N '' -C root@{self.name} -f /etc/ssh/ssh_host_ed25519_key"
                " && systemctl reload ssh.service")
        line = self.read_file("/etc/ssh/ssh_host_ed25519_key.pub")
        self.host_key = " ".join(line.split()[:2])
        self.wait_ssh_banner()
        return self.host_key
