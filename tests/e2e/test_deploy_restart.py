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

from tests.e2e.host_setup import deployed_and_running

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

UNIT = "ddtree-dr.service"
SERVICES = {"dr": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/dr",
                   "served_model_name": "dr", "unit_name": "ddtree-dr", "exec_start": "/bin/sleep infinity"}}
OLD = "a0a0a0a0a0a0"


@pytest.mark.testbed
def test_a_failed_restart_after_the_switch_is_in_the_audit_log(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["dr-host"])
    inventory, new = deployed_and_running(testbed, host, tmp_path, SERVICES, "dr", OLD, UNIT)
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
