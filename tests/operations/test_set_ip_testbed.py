"""`ddtreectl set-ip` end to end against REAL test hosts (systemd + sshd in namespaces).

The installed command is run as a subprocess, as an operator would: a host moved to a new VLAN
address is proven by its pinned key and machine-id, the inventory changes by exactly one line,
`status` then works at the new address; a different machine at the address is refused with the
file untouched; the sweep finds the old address in a template and in a unit installed on a peer.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from ddtreectl.inventory.loader import load

pytestmark = pytest.mark.testbed
Boot = Callable[..., list[Any]]


def ddtreectl(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    cli = [exe] if exe else [sys.executable, "-c", "from ddtreectl.cli.main import main; main()"]
    return subprocess.run([*cli, "-i", str(inventory), *args], capture_output=True, text=True,
                          timeout=180, cwd=inventory.parent)


def changed(old: str, new: str) -> list[str]:
    return [ln for ln in difflib.ndiff(old.splitlines(), new.splitlines()) if ln[:2] in ("- ", "+ ")]


def test_move_verify_sweep_and_status_at_the_new_address(
    testbed: Any, boot_hosts: Boot, tmp_path: Path
) -> None:
    mover, peer = boot_hosts(["sip-mover", "sip-peer"])
    old = mover.address
    proj = tmp_path / "proj"
    (proj / "templates").mkdir(parents=True)
    (proj / "templates" / "rank1.service.j2").write_text(
        "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server \\\n"
        f"    --dist-init-addr {old}:5000 --nnodes 2 --node-rank 1\n")
    inventory = testbed.inventory([mover, peer], proj / "hosts.yaml")
    # A multi-node peer's unit, already installed, still points at rank 0's old address.
    peer.write_file("/etc/systemd/system/sglang-rank1.service",
                    f"[Service]\nExecStart=/bin/true --dist-init-addr {old}:5000\n")
    before = inventory.read_text()
    new = testbed.new_address()
    mover.move_address(new)

    run = ddtreectl(inventory, "set-ip", "sip-mover", new, "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    after = inventory.read_text()
    assert changed(before, after) == [f"-     address: {old}", f"+     address: {new}"]
    assert (doc["old"], doc["new"], doc["changed"], doc["verified"]) == (old, new, True, True)
    assert doc["matched"] == ["host key", "machine-id"]
    assert [(r["path"], r["line"]) for r in doc["project_refs"]] == [("templates/rank1.service.j2", 3)]
    assert doc["rerender_hosts"] == ["sip-peer"]
    assert doc["hosts"]["sip-peer"]["refs"] == [{
        "path": "/etc/systemd/system/sglang-rank1.service", "line": 2,
        "text": f"ExecStart=/bin/true --dist-init-addr {old}:5000"}]
    assert doc["hosts"]["sip-mover"] == {"swept": True, "error": None, "needs_rerender": False, "refs": []}
    assert doc["audit"] == "written"
    audit = json.loads(mover.read_file("/opt/ddtree/state/audit.log").splitlines()[-1])
    assert (audit["action"], audit["host"], audit["old"], audit["new"]) == ("set-ip", "sip-mover", old, new)

    # same pinned key, new address: status answers
    host = load(inventory).host("sip-mover")
    assert host.address == new and host.host_key == mover.host_key
    status = ddtreectl(inventory, "status", "sip-mover", "--json")
    assert status.returncode == 0, status.stderr + status.stdout
    (entry,) = json.loads(status.stdout)["hosts"]
    assert (entry["name"], entry["address"], entry["outcome"]) == ("sip-mover", new, "ok")
    assert entry["identity"]["machine_id"] == mover.machine_id

    again = ddtreectl(inventory, "set-ip", "sip-mover", new)
    assert again.returncode == 0 and "already at" in again.stdout


def test_a_different_machine_at_the_new_address_is_refused(
    testbed: Any, boot_hosts: Boot, tmp_path: Path
) -> None:
    ours, stranger = boot_hosts(["sip-ours", "sip-stranger"])
    inventory = testbed.inventory([ours], tmp_path / "hosts.yaml")
    before = inventory.read_bytes()
    run = ddtreectl(inventory, "set-ip", "sip-ours", stranger.address)
    assert run.returncode == 4, run.stdout + run.stderr
    first = run.stderr.splitlines()[0]
    assert first.startswith(f"error: sip-ours: the machine at {stranger.address} is not sip-ours: "
                            f"HOST KEY MISMATCH at {stranger.address}:22")
    assert "the inventory was not changed" in first
    # The hint is about the address, not the generic "run trust --replace" of a connection refused
    # for its key: re-trusting sip-ours where it still is would change nothing, and after a forced
    # move it would pin the stranger's key under our name.
    hint = run.stderr.split("hint: ", 1)[1]
    assert hint.startswith(f"check which machine has {stranger.address}"), hint
    assert inventory.read_bytes() == before
    # --dry-run checks the same way
    assert ddtreectl(inventory, "set-ip", "sip-ours", stranger.address, "--dry-run").returncode == 4


def test_cloned_host_key_on_another_machine_is_caught_by_machine_id(
    testbed: Any, boot_hosts: Boot, tmp_path: Path
) -> None:
    orig, clone = boot_hosts(["sip-orig", "sip-clone"])
    for name, mode in (("ssh_host_ed25519_key", 0o600), ("ssh_host_ed25519_key.pub", 0o644)):
        clone.write_file(f"/etc/ssh/{name}", (orig.root / "etc/ssh" / name).read_bytes(), mode)
    clone.systemctl("restart", "ssh.service")
    inventory = testbed.inventory([orig], tmp_path / "hosts.yaml")
    before = inventory.read_bytes()
    run = ddtreectl(inventory, "set-ip", "sip-orig", clone.address)
    assert run.returncode == 4, run.stdout + run.stderr
    assert run.stderr.splitlines()[0] == (
        f"error: sip-orig: the machine at {clone.address} is not sip-orig: machine-id is "
        f"{clone.machine_id}, recorded {orig.machine_id}; the inventory was not changed")
    assert inventory.read_bytes() == before


GPU_A, GPU_B, GPU_C = (f"GPU-{n}a3c9d1e-7b2f-4c8a-9e61-0d4f3b2a1c90" for n in "123")
NVIDIA_SMI_STUB = f"""#!/bin/sh
case "$*" in
  *--query-gpu=uuid*--format=csv,noheader*) printf '%s\\n' {GPU_A} {GPU_B} ;;
  *) echo "stub: unexpected arguments: $*" >&2; exit 9 ;;
esac
"""


def test_gpu_uuids_are_checked(testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (box,) = boot_hosts(["sip-gpu"], gpus_stub={"sip-gpu": NVIDIA_SMI_STUB})
    inventory = testbed.inventory([box], tmp_path / "hosts.yaml", host_overrides={
        "sip-gpu": {"gpus": 2, "gpu_uuids": [GPU_A, GPU_C]}})
    before = inventory.read_bytes()
    new = testbed.new_address()
    box.move_address(new)
    run = ddtreectl(inventory, "set-ip", "sip-gpu", new)
    assert run.returncode == 4, run.stdout + run.stderr
    assert f"GPU UUIDs differ: missing {GPU_C}; unexpected {GPU_B}" in run.stderr
    assert inventory.read_bytes() == before
    inventory.write_text(inventory.read_text().replace(GPU_C, GPU_B))
    run = ddtreectl(inventory, "set-ip", "sip-gpu", new)
    assert run.returncode == 0, run.stderr
    assert "identity verified: host key, machine-id, 2 GPU UUIDs" in run.stdout.splitlines()[-1]


def test_no_verify_for_a_host_that_is_still_down(testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (down,) = boot_hosts(["sip-down"])
    inventory = testbed.inventory([down], tmp_path / "hosts.yaml")
    new = testbed.new_address()
    down.move_address(new)
    down.stop_sshd()
    refused = ddtreectl(inventory, "set-ip", "sip-down", new)
    assert refused.returncode == 4 and "connection refused" in refused.stderr
    run = ddtreectl(inventory, "set-ip", "sip-down", new, "--no-verify")
    assert run.returncode == 0, run.stderr
    assert "note: identity NOT verified (--no-verify)" in run.stdout
    assert "audit: not written (host not reachable)" in run.stdout
    assert "NOT swept: sip-down" in run.stdout.splitlines()[-1]
    assert load(inventory).host("sip-down").address == new
