"""End-to-end: Ctrl-C during `ddtreectl mode HOST dev` after production was stopped, on a real systemd
+ sshd test host with the engine's reference server as the service.

Found in an operator walkthrough: interrupted after "stopping …", the command ended with exit 130 and
not one word; the service stayed stopped and disabled, no lease was written, and `status` showed the
host as "mode prod" with a service that will not start at boot. Now it says what state the host is in
and the two ways out, and the switch is an audit line like every other.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built, reference_service
from tests.e2e.test_status import nvidia_smi_stub
from tests.probes.fixtures import fixture

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
UNIT = "mi-ref.service"
# Memory in use and no compute process, on every sample: the idle check after the stop never passes,
# so the switch sits in "verifying the GPUs went idle" with production already stopped.
BUSY_FOREVER = nvidia_smi_stub(fixture("nvidia-smi-gpus-h200-1x-memory-no-process.txt"), "")


@pytest.mark.testbed
def test_ctrl_c_after_the_stop_says_the_host_is_out_of_production_and_held_by_nobody(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["mi-host"], gpus_stub={"mi-host": BUSY_FOREVER})
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services={"ref": reference_service("mi-ref", "mi")},
                                  host_overrides={"mi-host": {"service": "ref", "role": "prod", "gpus": 1}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")  # rendered from beside the inventory
    lay_out_built(host, "r1")
    host.sh("ln -sfn releases/r1 /opt/ddtree/current")
    install_service_units(inventory, host.name)
    host.systemctl("enable", "--now", UNIT)
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."

    proc = subprocess.Popen([exe, "-i", str(inventory), "mode", "mi-host", "dev", "--reason", "profile",
                             "--idle-timeout", "240", "--drain-timeout", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while host.systemctl("is-active", UNIT, check=False).stdout.strip() != "inactive":
            assert proc.poll() is None, f"mode exited early ({proc.returncode}): {proc.communicate()}"
            assert time.monotonic() < deadline, "mode never stopped the service"
            time.sleep(0.1)
        time.sleep(1.0)  # into the idle wait
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert proc.returncode == 130, err
    assert f"interrupted after {UNIT} was disabled and stopped" in err, err
    assert "the host is out of production and nobody holds it" in err, err
    assert "`ddtreectl mode mi-host prod` brings production back" in err, err
    # exactly the state the message describes
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
    assert host.systemctl("is-enabled", UNIT, check=False).stdout.strip() == "disabled"
    assert not (host.root / "opt/ddtree/state/mode.json").exists()
    assert not (host.root / "opt/ddtree/state/locks/mode.lock").exists()
    last = json.loads((host.root / "opt/ddtree/state/audit.log").read_text().splitlines()[-1])
    assert (last["action"], last["to"], last["ok"], last["interrupted"], last["stopped"]) == (
        "mode", "dev", False, True, True), last
