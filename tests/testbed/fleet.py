"""A fleet of real test hosts (systemd + sshd in namespaces) in one slot of this machine.

See shared/testbed.md for why each step is what it is, and README.md here for the API.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.testbed import resources
from tests.testbed.host import TestHost
from tests.testbed.layout import Slot, SlotLock, acquire_free_slot, cgroup2_mount
from tests.testbed.rootfs import generate_ed25519, populate

HOST_INIT = Path(__file__).with_name("host-init.sh")
NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")


class BootError(RuntimeError):
    """A host did not come up `running`; the message has the failed units and log tails."""


class Fleet:
    """Owns one slot: its bridge, subnets, cgroups and work dir, and every host booted in it."""

    def __init__(self, *, boot_timeout: float = 90) -> None:
        root = cgroup2_mount()
        if root is None:
            raise RuntimeError("no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")
        self._lock: SlotLock | None
        self._lock, number = acquire_free_slot()
        self.slot = Slot(number, root)
        self.boot_timeout = boot_timeout
        self.hosts: dict[str, TestHost] = {}
        self._next_index = 0
        self._next_vlan = 0
        try:
            resources.clean_slot(self.slot)  # a crashed run of this slot may have left things
            resources.raise_inotify_limits()
            self.workdir = self.slot.workdir
            (self.workdir / "hosts").mkdir(parents=True)
            (self.workdir / "keys").mkdir(mode=0o700)
            resources.make_cgroup(self.slot.cgroup)
            resources.create_bridge(self.slot)
            self.client_key: Path = self.workdir / "keys" / "client_ed25519"
            self.client_pubkey: str = generate_ed25519(self.client_key, f"ddtreectl-testbed-slot{number}")
        except BaseException:
            self.close()
            raise

    # --- addresses ---------------------------------------------------------------------------

    @property
    def gateway(self) -> str:
        """The bridge's address in the primary subnet (the runner, as the hosts see it)."""
        return self.slot.gateway

    @property
    def vlan_gateway(self) -> str:
        """The bridge's address in the second ("new VLAN") subnet."""
        return self.slot.vlan_gateway

    def new_address(self) -> str:
        """A never-used address in the second subnet, for `TestHost.move_address`."""
        address = self.slot.vlan_address(self._next_vlan)
        self._next_vlan += 1
        return address

    # --- boot --------------------------------------------------------------------------------

    def boot(self, names: list[str], *, gpus_stub: dict[str, str] | None = None,
             files: dict[str, dict[str, str | bytes]] | None = None) -> list[TestHost]:
        """Boot hosts in parallel; return once each answers SSH and systemd says `running`.

        gpus_stub: host name -> nvidia-smi script installed at /usr/local/bin/nvidia-smi before boot.
        files: host name -> {absolute path: content} written (0644) into the host before boot, e.g. a
        unit plus a `multi-user.target.d/*.conf` drop-in with `Wants=` to have it started at boot.
        Raises BootError (after tearing down this call's hosts) if any host fails or is `degraded`.
        """
        if threading.current_thread() is not threading.main_thread():
            # PR_SET_PDEATHSIG fires when the forking THREAD exits, not the process
            raise RuntimeError("Fleet.boot must be called from the main thread")
        gpus_stub, files = gpus_stub or {}, files or {}
        for name in names:
            if not NAME_RE.match(name):
                raise ValueError(f"bad host name {name!r} (want {NAME_RE.pattern})")
            if name in self.hosts:
                raise ValueError(f"host {name!r} is already up in slot {self.slot.number}")
        if len(set(names)) != len(names) or (set(gpus_stub) | set(files)) - set(names):
            raise ValueError(f"duplicate names, or gpus_stub/files for hosts not booted here: {names}, "
                             f"{sorted(set(gpus_stub) | set(files))}")

        started: list[TestHost] = []
        try:
            for name in names:
                started.append(self._launch(name, gpus_stub.get(name), files.get(name, {})))
                self.hosts[name] = started[-1]
            for host in started:
                self._wire_and_release(host)
            with ThreadPoolExecutor(max_workers=max(1, len(started))) as pool:
                errors = [e for e in pool.map(self._wait_ready, started) if e]
            if errors:
                raise BootError("\n\n".join(errors))
        except BaseException:
            self.shutdown_all(started)
            raise
        return started

    def _launch(self, name: str, nvidia_smi_stub: str | None, files: dict[str, str | bytes]) -> TestHost:
        index = self._next_index
        self._next_index += 1
        hostdir = self.workdir / "hosts" / name
        resources.remove_workdir(hostdir)  # left by an earlier host of that name
        for sub in ("upper", "work", "root"):
            (hostdir / sub).mkdir(parents=True)
        (hostdir / "console.log").touch()
        os.mkfifo(hostdir / "go", 0o600)
        machine_id, host_key = populate(hostdir / "upper", name=name, client_pubkey=self.client_pubkey,
                                        keydir=self.workdir / "keys", nvidia_smi_stub=nvidia_smi_stub,
                                        extra_files=files)
        cgroup = self.slot.cgroup / name
        launcher = self._start_init(name, cgroup, hostdir)
        host = TestHost(name=name, address=self.slot.host_address(index), init_pid=0,
                        machine_id=machine_id, host_key=host_key, index=index, cgroup=cgroup,
                        hostdir=hostdir, gateway=self.gateway, vlan_gateway=self.vlan_gateway,
                        launcher=launcher)
        return host

    def _start_init(self, name: str, cgroup: Path, hostdir: Path) -> subprocess.Popen[bytes]:
        """Start host-init for `hostdir` from a fresh child cgroup; it waits for the network."""
        resources.kill_cgroup(cgroup)  # an earlier host of that name that failed to tear down
        resources.remove_cgroup_tree(cgroup)
        resources.make_cgroup(cgroup)
        with open(hostdir / "console.log", "ab") as console:
            launcher = subprocess.Popen(
                ["/bin/sh", "-c",
                 'echo $$ > "$1/cgroup.procs" && shift && exec setpriv --pdeathsig KILL -- '
                 "unshare --net --mount --pid --fork --kill-child=SIGKILL --cgroup --uts --ipc "
                 '--propagation private -- "$@"',
                 "launch", str(cgroup), str(HOST_INIT), str(hostdir), name, str(cgroup), "boot"],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                close_fds=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        return launcher

    def reboot(self, host: TestHost) -> TestHost:
        """Power-cycle a host: kill everything in it, then boot the same root again.

        What was written to disk (enabled units, releases, state files) survives in the upper dir;
        processes, /run, /tmp and the volatile journal do not, as after a real reboot. The host keeps
        its name, key, machine-id and current address. Returns once it is `running` again.
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("Fleet.reboot must be called from the main thread")
        resources.kill_cgroup(host.cgroup)
        if host.launcher is not None:
            host.launcher.wait(timeout=10)
        resources.delete_link(self.slot.veth(host.index))
        resources.remove_workdir(host.hostdir / "work")  # overlayfs needs an empty work dir per mount
        (host.hostdir / "work").mkdir()
        host.launcher = self._start_init(host.name, host.cgroup, host.hostdir)
        host.init_pid = 0
        self._wire_and_release(host)
        error = self._wait_ready(host)
        if error:
            raise BootError(error)
        return host

    def _find_init_pid(self, host: TestHost, timeout: float = 10) -> int:
        """The root-namespace PID of the host's PID 1: the process in its cgroup whose NSpid ends in 1."""
        deadline = time.monotonic() + timeout
        assert host.launcher is not None
        while time.monotonic() < deadline:
            if host.launcher.poll() is not None:
                raise BootError(f"{host.name}: host-init exited with {host.launcher.returncode}\n"
                                + _tail(host.console_log))
            for pid in (host.cgroup / "cgroup.procs").read_text().split():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                except FileNotFoundError:
                    continue
                nspid = re.search(r"^NSpid:\s+(.*)$", status, re.M)
                if nspid and nspid.group(1).split() == [pid, "1"]:
                    return int(pid)
            time.sleep(0.005)
        raise BootError(f"{host.name}: no PID 1 in {host.cgroup} after {timeout}s\n" + _tail(host.console_log))

    def _wire_and_release(self, host: TestHost) -> None:
        host.init_pid = self._find_init_pid(host)
        veth = self.slot.veth(host.index)
        resources.delete_link(veth)
        run = resources.run
        run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", str(host.init_pid)])
        run(["ip", "link", "set", veth, "master", self.slot.bridge, "up"])
        gateway = self.vlan_gateway if host.address.split(".")[1] == self.vlan_gateway.split(".")[1] else self.gateway
        run(["nsenter", "-t", str(host.init_pid), "-n", "--", "sh", "-c",
             f"ip link set lo up && ip addr add {host.address}/16 dev eth0 && ip link set eth0 up"
             f" && ip route add default via {gateway}"])
        # host-init blocks reading this FIFO; non-blocking open fails (ENXIO) until it is reading
        deadline = time.monotonic() + 10
        while True:
            try:
                fd = os.open(host.hostdir / "go", os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    raise BootError(f"{host.name}: host-init never waited for the network ({exc})\n"
                                    + _tail(host.console_log)) from exc
                assert host.launcher is not None
                if host.launcher.poll() is not None:
                    raise BootError(f"{host.name}: host-init exited with {host.launcher.returncode}\n"
                                    + _tail(host.console_log)) from exc
                time.sleep(0.005)
        try:
            os.write(fd, b"go\n")
        finally:
            os.close(fd)

    def _wait_ready(self, host: TestHost) -> str | None:
        """None when the host answers SSH and is `running`; else a report of what is wrong."""
        deadline = time.monotonic() + self.boot_timeout
        try:
            host.wait_ssh_banner(timeout=self.boot_timeout)
        except TimeoutError as exc:
            return _report(host, str(exc))
        try:
            state = subprocess.run(
                ["nsenter", "-t", str(host.init_pid), "-m", "-p", "--",
                 "systemctl", "is-system-running", "--wait"],
                capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()),
            ).stdout.strip()
        except subprocess.TimeoutExpired:
            state = "still starting (timeout)"
        if state == "running":
            return None
        failed = host.sh("systemctl --failed --plain --no-legend --no-pager", check=False).stdout.strip()
        return _report(host, f"system is {state!r}; failed units:\n{failed or '(none)'}")

    # --- teardown ----------------------------------------------------------------------------

    def shutdown(self, host: TestHost | str) -> None:
        """Kill a host (cgroup.kill), then remove its cgroup, veth and work dir."""
        name = host if isinstance(host, str) else host.name
        entry = self.hosts.pop(name, None) or (host if isinstance(host, TestHost) else None)
        if entry is None:
            return
        resources.kill_cgroup(entry.cgroup)
        if entry.launcher is not None:
            entry.launcher.wait(timeout=10)
        resources.remove_cgroup_tree(entry.cgroup)
        resources.delete_link(self.slot.veth(entry.index))
        resources.remove_workdir(entry.hostdir)

    def shutdown_all(self, hosts: list[TestHost] | None = None) -> None:
        """Shut down `hosts` (default: every host that is up), killing all of them first."""
        hosts = list(self.hosts.values()) if hosts is None else hosts
        for host in hosts:  # cgroup.kill is asynchronous: let them all die at once
            if (host.cgroup / "cgroup.kill").exists():
                (host.cgroup / "cgroup.kill").write_text("1\n")
        for host in hosts:
            self.shutdown(host)

    def close(self) -> None:
        """Tear the whole slot down and release its lock. Idempotent."""
        if self._lock is None:
            return
        try:
            self.shutdown_all()
            resources.clean_slot(self.slot)
        finally:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- ssh (the system client, strict host-key checking) ---------------------------------------

    def ssh_argv(self, host: TestHost, *, address: str | None = None, pinned_key: str | None = None,
                 connect_timeout: float = 5) -> list[str]:
        """`ssh ... root@ADDRESS` (append the command): key auth with the client key, host key checked
        strictly against a known_hosts holding only `pinned_key` (default: the host's current key)."""
        address = address or host.address
        known_hosts = self.workdir / "known_hosts" / f"{host.name}-{address}-{os.getpid()}-{threading.get_ident()}"
        known_hosts.parent.mkdir(exist_ok=True)
        known_hosts.write_text(f"{address} {pinned_key or host.host_key}\n")
        return ["ssh", "-F", "/dev/null", "-i", str(self.client_key), "-o", "IdentitiesOnly=yes",
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", f"ConnectTimeout={connect_timeout:g}", "-o", "LogLevel=ERROR", f"root@{address}"]

    def ssh(self, host: TestHost, command: str, *, address: str | None = None, pinned_key: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run `command` on the host over real SSH (system client; see ssh_argv). Never raises on rc."""
        return subprocess.run(self.ssh_argv(host, address=address, pinned_key=pinned_key) + [command],
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    # --- inventory ---------------------------------------------------------------------------

    def inventory(self, hosts: list[TestHost], path: Path, *, services: dict[str, Any] | None = None,
                  groups: dict[str, list[str]] | None = None,
                  host_overrides: dict[str, dict[str, Any]] | None = None, pin_keys: bool = True) -> Path:
        """Write a hosts.yaml (the schema of the shipped one) for `hosts`; returns `path`."""
        import yaml

        entries: dict[str, dict[str, Any]] = {}
        for host in hosts:
            entry: dict[str, Any] = {
                "address": host.address,
                "port": 22,
                "user": "root",
                "identity_file": str(self.client_key),
                "host_key": host.host_key if pin_keys else None,
                "machine_id": host.machine_id,
                "gpus": 0,
                "role": "dev",
                "remote_root": "/opt/ddtree",
            }
            entry.update((host_overrides or {}).get(host.name, {}))
            entries[host.name] = entry
        unknown = set(host_overrides or {}) - set(entries)
        if unknown:
            raise ValueError(f"host_overrides for hosts not in the inventory: {sorted(unknown)}")
        doc: dict[str, Any] = {}
        if services:
            doc["services"] = services
        doc["hosts"] = entries
        if groups:
            doc["groups"] = groups
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# test inventory written by tests/testbed (slot {self.slot.number})\n"
                        + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
        return path


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    return "console (tail):\n" + "\n".join(text[-lines:])


def _report(host: TestHost, what: str) -> str:
    return f"{host.name} ({host.address}, pid {host.init_pid}): {what}\n" \
           f"journal (tail):\n{host.journal(lines=30)}\n{_tail(host.console_log, 20)}"
