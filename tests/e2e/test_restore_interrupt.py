"""End-to-end: Ctrl-C during `restore-service`'s health gate, on a real systemd + sshd test host.

Session 12 made deploy / rollback --restart stop their gate at Ctrl-C and exit 130 saying the state
the host is in. restore-service's own gate did not look at the interrupt: ddtreectl printed a bare
"interrupted", with neither the unit's state nor a next step, and its gate thread went on polling.
Now it stops waiting at once and says: the unit was started (enabled at boot), its health unknown,
`status HOST` / `restore-service HOST` as the next steps; the audit line records the phase. The
reference server with a long `--load-delay` stays loading (/health 503) for the whole test.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built, reference_service, stand_in_workspace

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

UNIT = "ref-ri.service"


def main_pid(host: Any) -> str:
    return str(host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout.strip())


@pytest.mark.testbed
def test_ctrl_c_stops_the_restore_gate_and_says_the_state(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["ri-host"])
    services = {"ref": reference_service("ref-ri", "tiny-ri", load_delay_s=600)}
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=services,
                                  host_overrides={host.name: {"service": "ref", "role": "prod"}})
    release = stand_in_workspace(tmp_path)
    lay_out_built(host, release)
    host.sh(f"ln -sfn releases/{release} /opt/ddtree/current")
    install_service_units(inventory, host.name)
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"

    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    restore = subprocess.Popen([exe, "-i", str(inventory), "restore-service", host.name, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while main_pid(host) == "0" and time.monotonic() < deadline and restore.poll() is None:
        time.sleep(0.2)
    assert restore.poll() is None, restore.communicate()
    time.sleep(3)  # the gate is polling now: the server loads for 600 s
    interrupted = time.monotonic()
    os.killpg(restore.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    out, err = restore.communicate(timeout=60)
    took = time.monotonic() - interrupted
    assert restore.returncode == 130, (out, err)
    assert took < 15, f"{took:.1f} s after Ctrl-C"
    doc = json.loads(out)
    assert doc["schema"] == "ddtreectl.restore-service/1" and doc["exit_code"] == 130, doc
    message = doc["error"]["message"]
    assert "interrupted while verifying the start (" in message, message
    assert f"{UNIT} was started (enabled at boot); its health is unknown" in message, message
    assert f"`ddtreectl status {host.name}` says whether it serves yet" in err, err
    assert f"`ddtreectl restore-service {host.name}` verifies it" in err, err
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"  # left starting, not stopped
    last = json.loads((host.root / "opt/ddtree/state/audit.log").read_text().splitlines()[-1])
    assert (last["action"], last["unit"], last["ok"], last["started"]) == ("restore-service", UNIT, False, True), last
    assert last["interrupted"] in ("unit active", "port open", "liveness"), last
