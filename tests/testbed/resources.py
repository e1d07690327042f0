"""Creating and destroying the kernel resources of a slot: cgroups, links, work dirs.

Used both by the live fleet (teardown) and by `cleanup.py` (leftovers of a crashed run). Everything
here acts on paths and names derived from a `Slot`, never on anything found by process name.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.testbed.layout import BASE_DIR, Slot


def run(args: list[str], *, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a runner-side command, capturing output; errors carry stderr."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


# --- cgroups -----------------------------------------------------------------------------------

def kill_cgroup(path: Path, *, timeout: float = 10) -> None:
    """SIGKILL every process in the cgroup subtree (cgroup.kill) and wait until it is empty."""
    if not path.is_dir():
        return
    kill_file = path / "cgroup.kill"
    if kill_file.exists():
        kill_file.write_text("1\n")
    else:  # kernels < 5.14: kill member by member, bottom-up
        for sub in _subtree_bottom_up(path):
            for pid in (sub / "cgroup.procs").read_text().split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + timeout
    while _populated(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"cgroup {path} still has processes {timeout}s after cgroup.kill")
        time.sleep(0.01)


def remove_cgroup_tree(path: Path) -> None:
    """rmdir a cgroup and its descendants, deepest first (they must be empty)."""
    if not path.is_dir():
        return
    for sub in _subtree_bottom_up(path):
        for attempt in range(200):
            try:
                sub.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                # EBUSY for a moment after the last process died (the kernel frees it async)
                if attempt == 199:
                    raise
                time.sleep(0.01)


def _populated(path: Path) -> bool:
    try:
        events = (path / "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    return "populated 1" in events


def _subtree_bottom_up(path: Path) -> list[Path]:
    dirs = [Path(root) for root, _, _ in os.walk(path)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def make_cgroup(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


# --- network links -----------------------------------------------------------------------------

def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def slot_links(slot: Slot) -> list[str]:
    """Root-namespace links that belong to the slot: its bridge and its veths."""
    prefix = f"{slot.bridge}h"
    return sorted(
        name for name in os.listdir("/sys/class/net") if name == slot.bridge or name.startswith(prefix)
    )


def delete_link(name: str) -> None:
    if link_exists(name):
        run(["ip", "link", "del", name], check=False)


def create_bridge(slot: Slot) -> None:
    delete_link(slot.bridge)
    run(["ip", "link", "add", slot.bridge, "type", "bridge"])
    # no IPv6 on the test LAN: avoids DAD/router-solicitation noise and keeps traffic local
    Path(f"/proc/sys/net/ipv6/conf/{slot.bridge}/disable_ipv6").write_text("1\n")
    # Hosts route by default via the bridge: never forward what they send on to the outside world,
    # whatever the machine's global ip_forward says (IPv4 checks forwarding on the input device).
    Path(f"/proc/sys/net/ipv4/conf/{slot.bridge}/forwarding").write_text("0\n")
    run(["ip", "addr", "add", f"{slot.gateway}/16", "dev", slot.bridge])
    run(["ip", "addr", "add", f"{slot.vlan_gateway}/16", "dev", slot.bridge])
    run(["ip", "link", "set", slot.bridge, "up"])


# --- kernel limits -----------------------------------------------------------------------------

# Every host's systemd, journald, logind and dbus take inotify instances, all counted against root
# of the machine's user namespace (default limit 128 for the WHOLE machine). Past it, .path units
# fail and hosts boot `degraded`: 3 parallel runs of 8 hosts each already hit it here.
INOTIFY_FLOORS = {"max_user_instances": 8192, "max_user_watches": 1048576}


def raise_inotify_limits() -> None:
    """Raise fs.inotify limits to INOTIFY_FLOORS (never lowers a limit somebody set higher)."""
    for name, floor in INOTIFY_FLOORS.items():
        path = Path("/proc/sys/fs/inotify", name)
        if int(path.read_text()) < floor:
            path.write_text(f"{floor}\n")


# --- work dirs ---------------------------------------------------------------------------------

def mounts_under(path: Path) -> list[str]:
    """Mount points (in OUR mount namespace) at or below `path`."""
    prefix = str(path.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4]
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def remove_workdir(path: Path) -> None:
    """rm -rf a slot/host work dir, refusing anything outside BASE_DIR or with a mount below it.

    A host's overlay is mounted only inside its own mount namespace; if one ever showed up here,
    rmtree would walk into the machine's own / through it.
    """
    path = path.resolve()
    if BASE_DIR.resolve() not in path.parents:
        raise RuntimeError(f"refusing to remove {path}: not under {BASE_DIR}")
    if not path.exists():
        return
    mounted = mounts_under(path)
    if mounted:
        raise RuntimeError(f"refusing to remove {path}: mounts below it: {mounted}")
    shutil.rmtree(path, onerror=_chmod_and_retry)


def _chmod_and_retry(func, path, _exc_info):  # type: ignore[no-untyped-def]
    # overlay's work/work dir is created mode 000
    os.chmod(path, 0o700)
    func(path)


def clean_slot(slot: Slot) -> list[str]:
    """Remove every leftover of `slot` (caller holds the slot lock). Returns what was removed."""
    removed: list[str] = []
    if slot.cgroup.is_dir():
        for host_cg in sorted(p for p in slot.cgroup.iterdir() if p.is_dir()):
            kill_cgroup(host_cg)
            removed.append(str(host_cg))
        remove_cgroup_tree(slot.cgroup)
    for name in slot_links(slot):
        delete_link(name)
        removed.append(f"link {name}")
    if slot.workdir.exists():
        remove_workdir(slot.workdir)
        removed.append(str(slot.workdir))
    return removed
