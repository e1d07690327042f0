"""End-to-end: `ddtreectl deploy` onto a real test host whose disk fills up mid-deploy.

The host's `/opt/ddtree` is a tmpfs sized from what a deploy ships: half of it fills during the rsync
into the staged release; one and a half of it fills while the build copies the sources into its
workspace (a second copy). Either way the operator must read that the disk is full and what to do,
with the build's real exit status (it used to travel through a file that the full disk refused,
and the build then failed with `exit: Illegal number`, exit 2, and a hint to read a cut-short log).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddtreectl.operations.release import walk_files

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
BUILD = {"cuda_archs": ["90"], "cmake_args": ["-DDDTREE_OPS=draft_topk_lse", "-DDDTREE_BUILD_BENCH=OFF"]}


def shipped_kib(workspace: Path) -> int:
    """What one copy of the shipped files takes on a tmpfs (whole 4 KiB pages per file)."""
    files = walk_files(workspace / "engine") + walk_files(workspace / "templates", "templates/")
    total = 0
    for f in files:
        path = workspace / f.path if f.path.startswith("templates/") else workspace / "engine" / f.path
        total += -(-os.path.getsize(path) // 4096) * 4
    return total


@pytest.mark.testbed
@pytest.mark.parametrize(("fill", "phase"), [(0.5, "rsync failed"), (1.5, "build failed")])
def test_a_full_disk_is_named_with_what_to_do_and_nothing_switches(testbed: Any, boot_hosts: Any, tmp_path: Path,
                                                                    fill: float, phase: str) -> None:
    subprocess.run(["rsync", "-a", "--exclude=/build*/", "--exclude=__pycache__/", "--exclude=*.pyc",
                    f"{REPO}/engine/", f"{tmp_path}/engine/"], check=True)
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    (host,) = boot_hosts(["dfull-a" if fill < 1 else "dfull-b"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", host_overrides={host.name: {"build": BUILD}})
    size_kib = int(shipped_kib(tmp_path) * fill)
    host.sh(f"mkdir -p /opt/ddtree && mount -t tmpfs -o size={size_kib}k tmpfs /opt/ddtree")

    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([exe, "-i", str(inventory), "deploy", "--json", "--host", host.name],
                         capture_output=True, text=True, timeout=240)
    doc = json.loads(run.stdout)
    assert run.returncode == 5, (run.stdout, run.stderr)
    (error,) = doc["errors"]
    assert error["exit_code"] == 5
    assert error["error"].startswith(phase), error
    # rsync passes on its receiver's ENOSPC only sometimes (else exit 11 with an empty stderr, seen in
    # CI); then the error carries the host's free space, asked with df after the failure
    assert "No space left on device" in error["error"] or "KiB free under /opt/ddtree" in error["error"], error
    assert "Illegal number" not in error["error"]
    if phase == "build failed":
        # the build's own status (rsync's 11 "error in file IO"), not the shell's 2 of `exit ""`
        assert error["error"].startswith("build failed (exit 11)"), error
    assert "disk is full" in error["hint"] and "df -h /opt/ddtree" in error["hint"], error
    # nothing was switched and the lock is free again
    assert not (host.root / "opt/ddtree/current").exists()
    assert not (host.root / "opt/ddtree/state/locks/deploy.lock").exists()
