"""End-to-end: the journal lines a failed `restore-service` shows are those of THIS start, on a real host.

The failure report showed the unit's last 30 journal lines whatever their age: an older crash (here
a SIGKILL an hour "before") read as the cause of a start that failed for another reason (a port
that never opened). Now the lines begin at the host's clock just before the start.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
UNIT = "ddtree-fj.service"
HEALTH = {"unit_active_timeout": 20, "port_open_timeout": 3, "liveness_timeout": 3, "readiness_timeout": 3,
          "total_timeout": 60}
SERVICES = {"fj": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/fj",
                   "served_model_name": "fj", "unit_name": "ddtree-fj", "exec_start": "/bin/sleep infinity",
                   "health": HEALTH}}


@pytest.mark.testbed
def test_a_failed_restore_shows_only_this_starts_journal(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["fj-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={host.name: {"service": "fj", "role": "prod"}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    lay_out_built(host, "r1")
    host.sh("ln -sfn releases/r1 /opt/ddtree/current")
    install_service_units(inventory, host.name)

    # an older crash in the unit's journal, then stopped on purpose
    host.systemctl("start", UNIT)
    host.systemctl("kill", "--signal=KILL", UNIT)
    host.sh(f"for i in $(seq 50); do systemctl is-active --quiet {UNIT} || break; sleep 0.1; done; "
            f"systemctl stop {UNIT}; systemctl reset-failed {UNIT} || true")
    assert "status=9/KILL" in host.journal(UNIT, lines=30)
    time.sleep(1.1)  # the journal's --since has whole seconds: the old lines are a second older

    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    run = subprocess.run([exe, "-i", str(inventory), "restore-service", host.name, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 5, (run.stdout, run.stderr)
    (result,) = json.loads(run.stdout)["hosts"]
    failure = result["failure"]
    assert failure["phase"] == "port open", failure
    assert "Started" in failure["journal"], failure["journal"]  # this start's lines are there
    assert "status=9/KILL" not in failure["journal"], failure["journal"]  # the old crash is not
