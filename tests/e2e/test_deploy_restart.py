"""End-to-end: `ddtreectl deploy --restart` whose restart fails, on a real systemd + sshd test host.

`current` has moved by the time the service is restarted; a failed restart raised before the audit
line was written, so the host's audit log did not record the switch (it still read as the release
before). The release is laid out already built (same content hash, good stamp), so deploy only
activates it: no compiler is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddtreectl.inventory.loader import load
from ddtreectl.operations.release import release_id, walk_files
from ddtreectl.operations.units import install_units
from ddtreectl.render.units import render_service
from ddtreectl.transport import connect

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
UNIT = "ddtree-dr.service"
SERVICES = {"dr": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/dr",
                   "served_model_name": "dr", "unit_name": "ddtree-dr", "exec_start": "/bin/sleep infinity"}}
OLD = "a0a0a0a0a0a0"


def lay_out(host: Any, release: str) -> None:
    (host.root / "opt/ddtree/releases" / release).mkdir(parents=True)
    (host.root / "opt/ddtree/releases" / release / ".build-stamp").write_text(
        json.dumps({"id": release, "selftest": "skipped: no GPU"}) + "\n")


@pytest.mark.testbed
def test_a_failed_restart_after_the_switch_is_in_the_audit_log(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["dr-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={host.name: {"service": "dr", "role": "prod"}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine/CMakeLists.txt").write_text("# a stand-in engine: its release is laid out as built\n")
    files = walk_files(tmp_path / "engine") + walk_files(tmp_path / "templates", "templates/")
    new = release_id(files, {"cuda_archs": "", "cmake_args": []})  # no GPU, no build settings
    lay_out(host, OLD)
    lay_out(host, new)
    host.sh(f"ln -sfn releases/{OLD} /opt/ddtree/current")
    inv = load(inventory)
    rendered = render_service(inv, inv.host(host.name))
    assert rendered is not None
    with connect(inv.host(host.name), inv) as transport:
        install_units(transport, rendered)
    host.systemctl("start", UNIT)
    # running now, but it cannot start again
    host.write_file(f"/etc/systemd/system/{UNIT}.d/broken.conf", "[Service]\nExecStartPre=/bin/false\n")
    host.systemctl("daemon-reload")

    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([exe, "-i", str(inventory), "deploy", "--host", host.name, "--restart", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 5, (run.stdout, run.stderr)
    (error,) = json.loads(run.stdout)["errors"]
    assert f"systemctl restart {UNIT} failed" in error["error"] and f"`current` is {new}" in error["hint"], error
    assert os.readlink(host.root / "opt/ddtree/current") == f"releases/{new}"
    last = json.loads((host.root / "opt/ddtree/state/audit.log").read_text().splitlines()[-1])
    assert (last["action"], last["release"], last["previous"], last["outcome"]) == ("deploy", new, OLD, "activated")
    assert last["restarted"] is False and f"systemctl restart {UNIT} failed" in last["restart_failed"], last
    assert not (host.root / "opt/ddtree/state/locks/deploy.lock").exists()
