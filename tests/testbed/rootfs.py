"""Per-host files, written into a host's overlay upper dir BEFORE it boots.

The upper dir shadows the runner's own `/`, so these files are the only differences between a host
and the runner: identity (hostname, machine-id, host key), sshd policy, a quiet shell profile,
volatile journald and masks for units that fail or make no sense in a container.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

# Units enabled on the runner image that fail (or start timers/getty) inside a container host; left
# unmasked the system ends `degraded` instead of `running`.
MASKED_UNITS = (
    "console-getty.service",
    "getty@tty1.service",
    "postgresql.service",
    "systemd-timesyncd.service",
    "systemd-pstore.service",
    "e2scrub_reap.service",
    "e2scrub_all.timer",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "man-db.timer",
    "fstrim.timer",
    "dpkg-db-backup.timer",
    "systemd-tmpfiles-clean.timer",  # would walk /var/tmp, where the hosts' own upper dirs live
)

AUTHORIZED_KEYS_DIR = "/etc/ssh/authorized_keys"  # root-owned 0755: outside any 1777 directory

SSHD_CONFIG = f"""\
# ddtreectl test host: key-only root login, pinned ed25519 host key, no DNS lookups.
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile {AUTHORIZED_KEYS_DIR}/%u
UseDNS no
X11Forwarding no
MaxStartups 100:30:200
MaxSessions 50
"""

# The runner's own /root/.bashrc runs `pyenv init` (+170 ms per SSH exec); hosts get plain ones.
BASHRC = "# ddtreectl test host\n[ -z \"$PS1\" ] && return\n"
PROFILE = "# ddtreectl test host\n[ -n \"$BASH_VERSION\" ] && [ -f ~/.bashrc ] && . ~/.bashrc\n"

# PATH of a non-login SSH exec (sshd's compiled-in default on Debian).
SSH_EXEC_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


class UpperDir:
    """Writes files into an overlay upper dir, giving new parent dirs the lower (runner) dir's mode.

    A directory in the upper layer supplies the merged directory's attributes, so `mkdir -p` with
    default modes would silently turn e.g. /root (0700) into 0755 inside the host.
    """

    def __init__(self, upper: Path) -> None:
        self.upper = upper

    def _mkdirs(self, rel_dir: Path) -> None:
        current = self.upper
        lower = Path("/")
        for part in rel_dir.parts:
            current, lower = current / part, lower / part
            if current.is_dir():
                continue
            current.mkdir()
            if lower.is_dir():
                st = lower.stat()
                os.chown(current, st.st_uid, st.st_gid)
                os.chmod(current, st.st_mode & 0o7777)
            else:
                os.chmod(current, 0o755)

    def write(self, path: str, content: str | bytes, mode: int = 0o644) -> None:
        rel = Path(path).relative_to("/")
        self._mkdirs(rel.parent)
        target = self.upper / rel
        data = content.encode() if isinstance(content, str) else content
        target.write_bytes(data)
        os.chmod(target, mode)

    def symlink(self, path: str, to: str) -> None:
        rel = Path(path).relative_to("/")
        self._mkdirs(rel.parent)
        (self.upper / rel).symlink_to(to)


def generate_ed25519(path: Path, comment: str) -> str:
    """ssh-keygen an ed25519 key pair at `path` (private 0600); returns the public key line."""
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True, capture_output=True,
    )
    os.chmod(path, 0o600)
    return path.with_name(path.name + ".pub").read_text().strip()


def public_key_line(key_line: str) -> str:
    """`ssh-ed25519 AAAA...` without the comment."""
    return " ".join(key_line.split()[:2])


def populate(upper: Path, *, name: str, client_pubkey: str, keydir: Path,
             nvidia_smi_stub: str | None = None,
             extra_files: dict[str, str | bytes] | None = None) -> tuple[str, str]:
    """Write every per-host file into `upper`. Returns (machine_id, host public key line)."""
    files = UpperDir(upper)
    machine_id = uuid.uuid4().hex
    files.write("/etc/machine-id", machine_id + "\n", 0o444)
    files.write("/etc/hostname", name + "\n")
    files.write("/etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost ip6-localhost\n")
    # No DNS: the runner's resolver is not reachable from the test LAN (and must not be tried);
    # without a nameserver line glibc asks 127.0.0.1, which refuses at once.
    files.write("/etc/resolv.conf", "# ddtreectl test host: no DNS, hosts are reached by address\n")
    # The runner's fstab names ITS disks; systemd in a host would try to mount them.
    files.write("/etc/fstab", "# ddtreectl test host: the root is an overlay set up by host-init\n")

    # host key: generated runner-side (10 ms), copied in; the runner's other host keys stay unused
    # because sshd only loads the HostKey lines of our drop-in.
    host_pub = generate_ed25519(keydir / f"{name}_host_ed25519", f"root@{name}")
    files.write("/etc/ssh/ssh_host_ed25519_key", (keydir / f"{name}_host_ed25519").read_bytes(), 0o600)
    files.write("/etc/ssh/ssh_host_ed25519_key.pub", host_pub + "\n", 0o644)
    files.write("/etc/ssh/sshd_config.d/ddtreectl-testbed.conf", SSHD_CONFIG)
    files.write(f"{AUTHORIZED_KEYS_DIR}/root", client_pubkey + "\n", 0o644)

    files.write("/root/.bashrc", BASHRC)
    files.write("/root/.profile", PROFILE)
    files.write("/etc/systemd/journald.conf.d/ddtreectl-testbed.conf", "[Journal]\nStorage=volatile\n")
    for unit in MASKED_UNITS:
        files.symlink(f"/etc/systemd/system/{unit}", "/dev/null")

    # `python3` for non-login SSH commands: the runner's may only live under a pyenv tree in root's home
    if not any(Path(d, "python3").exists() for d in SSH_EXEC_PATH):
        # (a pyenv shim is a bash script that needs pyenv's env: link the real interpreter)
        files.symlink("/usr/local/bin/python3", str(Path(sys.executable).resolve()))
    if nvidia_smi_stub is not None:
        files.write("/usr/local/bin/nvidia-smi", nvidia_smi_stub, 0o755)
    for path, content in (extra_files or {}).items():
        files.write(path, content)
    return machine_id, public_key_line(host_pub)
