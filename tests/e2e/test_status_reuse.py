"""End-to-end: `ddtreectl status` keeps OpenSSH master connections warm across invocations (the
INSTALLED CLI against real systemd + sshd test hosts), with the same trust and error verdicts as a
fresh Paramiko connection: a rekey behind a warm master is still refused (exit 4), a moved host
gets a new master, a dead one never hangs the command, and `--no-reuse` opens none.

Each test gets its own control directory (tests/conftest.py: ssh_control_dir), which the CLI
inherits through $DDTREECTL_SSH_CONTROL_DIR; masters are observed with `ssh -O check`.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from ddtreectl.inventory.loader import load
from ddtreectl.transport import control
from ddtreectl.transport.hostkeys import PublicKey

pytestmark = pytest.mark.testbed
Boot = Callable[..., list[Any]]


def status(inventory: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([exe, "-i", str(inventory), "status", "--json", *args], capture_output=True,
                         text=True, timeout=120, env=env if env is not None else dict(os.environ))
    try:
        doc = json.loads(run.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {run.returncode}): {run.stdout!r} {run.stderr!r}") from None
    return run.returncode, doc, run.stderr


def hosts_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {h["name"]: h for h in doc["hosts"]}


def master_path(inventory: Path, name: str) -> str:
    path = control.control_path(load(inventory).host(name))
    assert path is not None
    return path


def sockets(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if stat.S_ISSOCK(os.lstat(os.path.join(directory, n)).st_mode)]


def test_second_status_reuses_the_master_and_no_reuse_opens_none(
        testbed: Any, boot_hosts: Boot, tmp_path: Path, ssh_control_dir: str) -> None:
    a, b = boot_hosts(["mx-a", "mx-b"])
    inventory = testbed.inventory([a, b], tmp_path / "hosts.yaml")

    # Off switches first: a fresh Paramiko connection per host, and no master left behind.
    for args, env in ((("--no-reuse",), None), ((), {**os.environ, "DDTREECTL_SSH_REUSE": "0"})):
        code, doc, stderr = status(inventory, *args, env=env)
        assert code == 0, stderr
        assert [(h["connection"], h["connect_ms"] is not None) for h in doc["hosts"]] == [("paramiko", True)] * 2
        assert sockets(ssh_control_dir) == []

    code, doc, stderr = status(inventory)
    assert code == 0, stderr
    first = hosts_of(doc)
    assert [first[n]["connection"] for n in ("mx-a", "mx-b")] == ["new", "new"]
    assert first["mx-a"]["identity"]["machine_id"] == a.machine_id
    assert first["mx-b"]["identity"]["machine_id"] == b.machine_id
    pids = {n: control.master_pid(master_path(inventory, n)) for n in ("mx-a", "mx-b")}
    assert all(pids.values()) and len(set(pids.values())) == 2, pids
    for pid in pids.values():
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "ssh"  # a background OpenSSH master

    code, doc, stderr = status(inventory)
    assert code == 0, stderr
    again = hosts_of(doc)
    assert [again[n]["connection"] for n in ("mx-a", "mx-b")] == ["reused", "reused"]
    assert {n: control.master_pid(master_path(inventory, n)) for n in pids} == pids  # the same masters
    assert again["mx-a"]["identity"]["boot_id"] == first["mx-a"]["identity"]["boot_id"]
    assert sorted(sockets(ssh_control_dir)) == sorted(os.path.basename(master_path(inventory, n)) for n in pids)


def test_rekey_behind_a_warm_master_is_still_refused_exit_4(
        testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (h,) = boot_hosts(["mx-rekey"])
    inventory = testbed.inventory([h], tmp_path / "hosts.yaml")
    code, doc, stderr = status(inventory)
    assert code == 0 and doc["hosts"][0]["connection"] == "new", stderr
    path = master_path(inventory, "mx-rekey")
    pid = control.master_pid(path)
    assert pid is not None

    old = PublicKey.parse(h.host_key)
    new = PublicKey.parse(h.regenerate_host_key())
    # The premise: the master, authenticated under the old key, still serves sessions.
    through_master = subprocess.run(["ssh", "-F", "/dev/null", "-S", path, "-o", "ControlMaster=no",
                                     "-o", "BatchMode=yes", h.address, "cat /etc/ssh/ssh_host_ed25519_key.pub"],
                                    capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert through_master.returncode == 0 and PublicKey.parse(through_master.stdout) == new

    code, doc, stderr = status(inventory)
    assert code == 4, stderr
    (r,) = doc["hosts"]
    assert r["outcome"] == "refused" and r["identity"] is None
    assert "HOST KEY MISMATCH" in r["error"]["message"]
    assert old.fingerprint in r["error"]["message"] and new.fingerprint in r["error"]["message"]
    assert "ddtreectl trust mx-rekey --replace" in r["error"]["hint"]
    assert control.master_pid(path) is None  # the master made under the old key is gone

    # Exactly the verdict of a fresh connection.
    code2, doc2, _ = status(inventory, "--no-reuse")
    assert code2 == 4 and doc2["hosts"][0]["error"] == r["error"]


def test_moved_host_gets_a_new_master_and_a_dead_master_does_not_hang(
        testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (h,) = boot_hosts(["mx-move"])
    inventory = testbed.inventory([h], tmp_path / "hosts.yaml", host_overrides={"mx-move": {"connect_timeout": 1}})
    assert status(inventory)[0] == 0
    old_path = master_path(inventory, "mx-move")
    old_pid = control.master_pid(old_path)
    assert old_pid is not None
    old_address = h.address
    new_address = testbed.new_address()
    h.move_address(new_address)  # the warm master's TCP connection now leads nowhere

    # Inventory not updated yet: the master is stuck on a dead connection. The session does not
    # start within 3 connect timeouts, the master is closed, and the fresh connect times out.
    code, doc, stderr = status(inventory, "--timeout", "30")
    assert code == 4, stderr  # its only host unreachable: 4, as every command
    (m,) = doc["hosts"]
    assert m["outcome"] == "unreachable"  # not "timeout": it did not wait for the global deadline
    assert m["error"]["message"] == f"cannot reach {old_address}:22: connection timed out"
    assert "`ddtreectl set-ip mx-move ADDRESS`" in m["error"]["hint"]  # OpenSSH's path names the host too
    assert control.master_pid(old_path) is None
    # With no master at all, OpenSSH's own timeout says the same as Paramiko's.
    code, doc, _ = status(inventory)
    assert (code, doc["hosts"][0]["error"]) == (4, m["error"])
    code, doc, _ = status(inventory, "--no-reuse")
    assert (code, doc["hosts"][0]["error"]) == (4, m["error"])

    # The entry follows the move: another control path, a new master, the same pinned key.
    inventory.write_text(inventory.read_text().replace(f"address: {old_address}\n", f"address: {new_address}\n"))
    code, doc, stderr = status(inventory)
    assert code == 0, stderr
    (m,) = doc["hosts"]
    assert (m["connection"], m["address"], m["identity"]["machine_id"]) == ("new", new_address, h.machine_id)
    new_path = master_path(inventory, "mx-move")
    assert new_path != old_path and control.master_pid(new_path) not in (None, old_pid)
    assert status(inventory)[1]["hosts"][0]["connection"] == "reused"


def test_moved_host_behind_a_warm_master_with_the_default_timeouts(
        testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    """The IP move ddtreectl exists for, with the shipped defaults (connect_timeout 5, --timeout 20)
    and no status option: the host's old address must read "unreachable ... set-ip", not "no answer
    by the deadline, raise --deadline". A session on a live master starts in milliseconds, so a warm
    master gets one connect timeout (plus 1 s) to start it, not three: three (16 s) plus the fresh
    connect (5 s) used to overrun the 20 s deadline."""
    (h,) = boot_hosts(["mx-move5"])
    inventory = testbed.inventory([h], tmp_path / "hosts.yaml", host_overrides={"mx-move5": {"connect_timeout": 5}})
    assert status(inventory)[0] == 0
    old_path = master_path(inventory, "mx-move5")
    assert control.master_pid(old_path) is not None
    old_address = h.address
    h.move_address(testbed.new_address())
    code, doc, stderr = status(inventory)
    assert code == 4, stderr  # its only host unreachable: 4, as every command
    (m,) = doc["hosts"]
    assert m["outcome"] == "unreachable", m["error"]
    assert m["error"]["message"] == f"cannot reach {old_address}:22: connection timed out"
    assert "set-ip" in m["error"]["hint"]
    assert control.master_pid(old_path) is None


def test_stopped_sshd_is_unreachable_in_the_paramiko_wording(
        testbed: Any, boot_hosts: Boot, tmp_path: Path, ssh_control_dir: str) -> None:
    (h,) = boot_hosts(["mx-nossh"])
    h.stop_sshd()
    inventory = testbed.inventory([h], tmp_path / "hosts.yaml")
    code, doc, stderr = status(inventory)
    assert code == 4, stderr  # its only host unreachable: 4, as every command
    (s,) = doc["hosts"]
    assert s["outcome"] == "unreachable"
    assert s["error"] == {"message": f"cannot reach {h.address}:22: connection refused",
                          "hint": "is sshd running on that port? check `port:` in the inventory",
                          "exit_code": 4}
    assert sockets(ssh_control_dir) == []
    code, doc, _ = status(inventory, "--no-reuse")
    assert (code, doc["hosts"][0]["error"]) == (4, s["error"])


def test_sshd_stopped_behind_a_warm_master_is_unreachable_as_on_a_fresh_connection(
        testbed: Any, boot_hosts: Boot, tmp_path: Path, ssh_control_dir: str) -> None:
    """Stopping sshd closes its listener but not the connections it accepted, so a warm master still
    runs commands: status used to answer "ok" for a host nobody can log in to any more (a new ssh,
    the restore gate's HTTP channel, another operator's status, `--no-reuse`). The probe now sees
    sshd's port has no listener: the master is closed and the verdict is a fresh connection's."""
    (h,) = boot_hosts(["mx-sshd-gone"])
    inventory = testbed.inventory([h], tmp_path / "hosts.yaml")
    code, doc, stderr = status(inventory)
    assert code == 0 and doc["hosts"][0]["connection"] == "new", stderr
    path = master_path(inventory, "mx-sshd-gone")
    assert control.master_pid(path) is not None

    h.stop_sshd()
    # The premise: the master still runs commands on the host.
    through_master = subprocess.run(["ssh", "-F", "/dev/null", "-S", path, "-o", "ControlMaster=no",
                                     "-o", "BatchMode=yes", h.address, "cat /etc/machine-id"],
                                    capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert (through_master.returncode, through_master.stdout.strip()) == (0, h.machine_id)

    code, doc, stderr = status(inventory)
    assert code == 4, (doc, stderr)
    (s,) = doc["hosts"]
    assert s["outcome"] == "unreachable" and s["identity"] is None, s
    assert s["error"] == {"message": f"cannot reach {h.address}:22: connection refused",
                          "hint": "is sshd running on that port? check `port:` in the inventory",
                          "exit_code": 4}
    assert control.master_pid(path) is None  # closed: later commands do not ride on it either
    code2, doc2, _ = status(inventory, "--no-reuse")
    assert (code2, doc2["hosts"][0]["error"]) == (4, s["error"])

    h.start_sshd()
    code, doc, stderr = status(inventory)
    assert code == 0 and doc["hosts"][0]["connection"] == "new", stderr
    assert status(inventory)[1]["hosts"][0]["connection"] == "reused"


def test_jump_hosts_and_unpinned_hosts_keep_the_paramiko_path(
        testbed: Any, boot_hosts: Boot, tmp_path: Path, ssh_control_dir: str) -> None:
    a, b, c = boot_hosts(["mx-bastion", "mx-inner", "mx-new"])
    inventory = testbed.inventory([a, b, c], tmp_path / "hosts.yaml",
                                  host_overrides={"mx-inner": {"jump_host": "mx-bastion"},
                                                  "mx-new": {"host_key": None}})
    code, doc, stderr = status(inventory, "mx-inner", "mx-new")
    assert code == 4, stderr
    hosts = hosts_of(doc)
    # A master's tunnel through a bastion would also hide a rekeyed bastion: no reuse there.
    assert (hosts["mx-inner"]["outcome"], hosts["mx-inner"]["connection"]) == ("ok", "paramiko")
    assert hosts["mx-inner"]["identity"]["machine_id"] == b.machine_id
    new = hosts["mx-new"]
    assert new["outcome"] == "refused" and "not trusted yet" in new["error"]["message"]
    assert PublicKey.parse(c.host_key).fingerprint in new["error"]["message"]
    assert "ddtreectl trust mx-new" in new["error"]["hint"]
    assert sockets(ssh_control_dir) == []


def test_without_an_ssh_binary_status_uses_paramiko(
        testbed: Any, boot_hosts: Boot, tmp_path: Path, ssh_control_dir: str) -> None:
    (h,) = boot_hosts(["mx-nossh-bin"])
    inventory = testbed.inventory([h], tmp_path / "hosts.yaml")
    empty = tmp_path / "empty-path"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty)}
    exe = Path(sys.executable).parent / "ddtreectl"  # the entry point itself (not a pyenv shim)
    assert exe.exists(), "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([str(exe), "-i", str(inventory), "status", "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # silently
    (s,) = json.loads(run.stdout)["hosts"]
    assert (s["outcome"], s["connection"]) == ("ok", "paramiko")
    assert sockets(ssh_control_dir) == []


def test_set_ip_and_trust_close_the_master_made_for_the_old_entry(
        testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    a, b = boot_hosts(["mx-setip", "mx-retrust"])
    inventory = testbed.inventory([a, b], tmp_path / "hosts.yaml")
    exe = shutil.which("ddtreectl")
    assert exe is not None
    assert status(inventory)[0] == 0
    paths = {n: master_path(inventory, n) for n in ("mx-setip", "mx-retrust")}
    assert all(control.master_pid(p) for p in paths.values())

    new_address = testbed.new_address()
    a.move_address(new_address)
    moved = subprocess.run([exe, "-i", str(inventory), "set-ip", "mx-setip", new_address],
                           capture_output=True, text=True, timeout=120)
    assert moved.returncode == 0, moved.stderr
    assert control.master_pid(paths["mx-setip"]) is None
    assert control.master_pid(paths["mx-retrust"]) is not None  # other hosts' masters stay

    b.regenerate_host_key()  # the warm master still serves under the old pin until trust replaces it
    trusted = subprocess.run([exe, "-i", str(inventory), "trust", "mx-retrust", "--replace", "--yes"],
                             capture_output=True, text=True, timeout=120)
    assert trusted.returncode == 0, trusted.stderr
    assert control.master_pid(paths["mx-retrust"]) is None

    code, doc, stderr = status(inventory)
    assert code == 0, stderr
    assert [(h["name"], h["connection"]) for h in doc["hosts"]] == [("mx-setip", "new"), ("mx-retrust", "new")]
    assert hosts_of(doc)["mx-setip"]["address"] == new_address
