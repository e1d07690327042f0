"""End-to-end: what `restore-service` tells the operator to do about a drifted unit, on a real host.

The hint said "redeploy" for every kind of drift, but a deploy neither installs nor removes drop-ins
(it printed "units unchanged" and the refusal stayed). Now a drop-in gets "remove the drop-in", and
a hand-edited unit gets the deploy that really reinstalls it (checked here with `render --diff`).
The release is laid out as built (same content hash, good stamp), so deploy needs no compiler.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import installed_current

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

UNIT = "ddtree-dh.service"
SERVICES = {"dh": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/dh",
                   "served_model_name": "dh", "unit_name": "ddtree-dh", "exec_start": "/bin/sleep infinity"}}


def ddtreectl(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), *args], capture_output=True, text=True, timeout=120)


def restore_error(inventory: Path, host: str) -> dict[str, Any]:
    run = ddtreectl(inventory, "restore-service", host, "--json")
    assert run.returncode == 5, (run.stdout, run.stderr)
    (result,) = json.loads(run.stdout)["hosts"]
    assert result["started"] is False
    return dict(result["error"])


@pytest.mark.testbed
def test_the_drift_hint_names_the_repair_that_works(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["dh-host"])
    inventory = installed_current(testbed, host, tmp_path, SERVICES, "dh")

    # a drop-in: a deploy leaves it (and says the units are unchanged), so the hint must not send
    # the operator there
    dropin = f"/etc/systemd/system/{UNIT}.d/override.conf"
    host.write_file(dropin, "[Service]\nEnvironment=X=1\n")
    host.systemctl("daemon-reload")
    error = restore_error(inventory, host.name)
    assert "drop-in overrides the rendered unit" in error["message"], error
    assert "remove the drop-in" in error["hint"] and "deploy" not in error["hint"].replace("a deploy leaves", ""), error
    run = ddtreectl(inventory, "deploy", "--host", host.name)
    assert run.returncode == 0 and "units unchanged" in run.stdout, (run.stdout, run.stderr)
    assert (host.root / dropin.lstrip("/")).exists()

    # a hand edit of the unit: the hinted deploy really reinstalls it
    host.sh(f"rm -r /etc/systemd/system/{UNIT}.d && sed -i 's/^Restart=.*/Restart=no/' /etc/systemd/system/{UNIT} "
            "&& systemctl daemon-reload")
    error = restore_error(inventory, host.name)
    assert "differs from the rendered file" in error["message"], error
    assert f"`ddtreectl deploy --host {host.name}` reinstalls the rendered files" in error["hint"], error
    run = ddtreectl(inventory, "deploy", "--host", host.name)
    assert run.returncode == 0 and f"units {UNIT} installed" in run.stdout, (run.stdout, run.stderr)
    diff = ddtreectl(inventory, "render", host.name, "--diff", "--json")
    assert json.loads(diff.stdout)["drift"] == [], diff.stdout
