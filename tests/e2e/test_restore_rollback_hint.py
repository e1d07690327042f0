"""End-to-end: what `restore-service` tells the operator when `current` has no built release but an
older good one is still on the host, on a real systemd + sshd test host through the installed CLI.

The hint named only `deploy` (a build the operator may not want or be able to run now), though
`rollback --to ID` activates a release with a good build stamp at once. Now it names both, with the
newest good release's id (and the others), and the rollback it names really works; with no good
release left it names deploy alone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

SERVICES = {"rh": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/rh",
                   "served_model_name": "rh", "unit_name": "ddtree-rh", "exec_start": "/bin/sleep infinity"}}
REPO = Path(__file__).resolve().parents[2]


def ddtreectl(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), *args], capture_output=True, text=True, timeout=120)


def refusal(inventory: Path, host: str) -> dict[str, Any]:
    run = ddtreectl(inventory, "restore-service", host, "--json")
    assert run.returncode == 5, (run.stdout, run.stderr)
    (result,) = json.loads(run.stdout)["hosts"]
    assert result["started"] is False and "no built release" in result["error"]["message"], result
    return dict(result["error"])


def test_no_built_current_release_hint_names_rollback_to_the_good_one(testbed: Any, boot_hosts: Any,
                                                                      tmp_path: Path) -> None:
    (host,) = boot_hosts(["rh-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={host.name: {"service": "rh", "role": "prod"}})
    shutil.copytree(REPO / "templates", inventory.parent / "templates")
    releases = host.root / "opt/ddtree/releases"
    # Two good releases from earlier deploys (the newer one first in the hint), and `current` on a
    # release directory without a build stamp (a copy someone pointed `current` at by hand).
    for name, age in (("r-older", 7200), ("r-good", 3600)):
        lay_out_built(host, name)
        stamp_time = (releases / name).stat().st_mtime - age
        os.utime(releases / name, (stamp_time, stamp_time))
    (releases / "r-bad").mkdir()
    host.sh("ln -sfn releases/r-bad /opt/ddtree/current")
    install_service_units(inventory, host.name)

    error = refusal(inventory, host.name)
    assert "current: r-bad, no build stamp" in error["message"], error
    hint = error["hint"]
    assert f"`ddtreectl deploy --host {host.name}`" in hint, hint
    assert f"`ddtreectl rollback --host {host.name} --to r-good` activates release r-good" in hint, hint
    assert "other good releases: r-older" in hint and "r-bad" not in hint, hint
    assert f"then `ddtreectl restore-service {host.name}`" in hint, hint
    # The text output carries the same hint.
    text = ddtreectl(inventory, "restore-service", host.name)
    assert text.returncode == 5 and "--to r-good" in text.stdout + text.stderr, (text.stdout, text.stderr)

    # `current` dangling (its release deleted): the same hint.
    shutil.rmtree(releases / "r-bad")
    assert "--to r-good` activates release r-good" in refusal(inventory, host.name)["hint"]

    # The hinted rollback really activates it, without a build.
    rolled = ddtreectl(inventory, "rollback", "--host", host.name, "--to", "r-good")
    assert rolled.returncode == 0, (rolled.stdout, rolled.stderr)
    assert host.sh("readlink /opt/ddtree/current").stdout.strip() == "releases/r-good"

    # No good release left besides a broken `current`: deploy is the only way, and the hint says only that.
    for name in ("r-good", "r-older"):
        (releases / name / ".build-stamp").unlink()
    hint = refusal(inventory, host.name)["hint"]
    assert f"`ddtreectl deploy --host {host.name}`" in hint and "rollback" not in hint, hint
