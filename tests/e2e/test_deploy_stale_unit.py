"""End-to-end: a service profile whose unit name changed, on a real systemd + sshd test host through
the installed CLI.

The operator's story (session 8's walkthrough): `unit_name` of a profile changes. The deploy installed
the new unit, but the old one stayed installed, enabled and running (its port, its GPUs, and it
would start again at boot), and neither `status` nor `deploy` said so. Now `status` warns with the
command that removes it, `deploy --plan` shows it, a deploy without --restart leaves the running
old unit alone but says so loudly (it never stops a serving process), and `deploy --restart` stops,
disables and deletes it, audited, and starts the new unit in its place, verified by the health
gate. A stopped old unit is removed by any deploy. The old units here were installed before the
record (state/units.list) existed: they are found by the header every rendered unit carries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built, reference_service, stand_in_workspace

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(420)]

OLD_UNIT, NEW_UNIT = "ddtree-old.service", "ddtree-new.service"
OLD_PROFILE = {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/sv",
               "served_model_name": "sv", "unit_name": "ddtree-old", "exec_start": "/bin/sleep infinity"}
RELEASE = "a0a0a0a0a0a0"


def ddtreectl(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "250"})


def host_doc(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(run.stdout)["hosts"][0])
    except ValueError:
        raise AssertionError(f"not JSON (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None


def unit_state(host: Any, unit: str) -> tuple[str, str]:
    active = host.systemctl("is-active", unit, check=False).stdout.strip()
    enabled = host.systemctl("is-enabled", unit, check=False).stdout.strip()
    return active, enabled


def audit(host: Any) -> list[dict[str, Any]]:
    log = host.root / "opt/ddtree/state/audit.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def renamed_host(testbed: Any, boot_hosts: Any, tmp_path: Path, name: str) -> tuple[Any, Path]:
    """A host serving under OLD_UNIT (enabled, running), then an inventory whose profile renders NEW_UNIT."""
    (host,) = boot_hosts([name])
    release = stand_in_workspace(tmp_path)
    lay_out_built(host, release)
    host.sh(f"ln -sfn releases/{release} /opt/ddtree/current")
    overrides = {host.name: {"service": "sv", "role": "prod"}}
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services={"sv": OLD_PROFILE},
                                  host_overrides=overrides)
    install_service_units(inventory, host.name)
    host.systemctl("enable", "--now", OLD_UNIT)
    assert unit_state(host, OLD_UNIT) == ("active", "enabled")
    testbed.inventory([host], inventory, services={"sv": reference_service("ddtree-new", "sv")},
                      host_overrides=overrides)
    return host, inventory


def test_a_renamed_unit_is_reported_then_replaced_by_deploy_restart(testbed: Any, boot_hosts: Any,
                                                                     tmp_path: Path) -> None:
    host, inventory = renamed_host(testbed, boot_hosts, tmp_path, "su-main")

    status = ddtreectl(inventory, "status", host.name, "--json")
    warnings = host_doc(status)["warnings"]
    (stale,) = [w for w in warnings if OLD_UNIT in w]
    assert "stale unit ddtree-old.service (active, enabled)" in stale and "still running" in stale, warnings
    assert f"`ddtreectl deploy {host.name} --restart`" in stale, stale

    plan = ddtreectl(inventory, "deploy", "--host", host.name, "--plan")
    assert plan.returncode == 0, (plan.stdout, plan.stderr)
    assert f"stale unit: {OLD_UNIT} (active, enabled) is no longer rendered for {host.name}" in plan.stdout, plan.stdout
    plan_json = host_doc(ddtreectl(inventory, "deploy", "--host", host.name, "--plan", "--json", "--restart"))
    assert any("would stop, disable and remove it" in s for s in plan_json["stale_units"]), plan_json

    # Without --restart: the serving old unit keeps running, and the deploy says so (text and JSON).
    run = ddtreectl(inventory, "deploy", "--host", host.name, "--json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    entry = host_doc(run)
    assert entry["stale_running"] == [OLD_UNIT] and entry["units_removed"] == [], entry
    assert f"STALE unit(s) {OLD_UNIT} still running" in run.stderr, run.stderr
    assert unit_state(host, OLD_UNIT) == ("active", "enabled")
    record = (host.root / "opt/ddtree/state/units.list").read_text().splitlines()
    assert record[0].split()[0] == NEW_UNIT and record[1:] == [OLD_UNIT], record
    text = ddtreectl(inventory, "deploy", "--host", host.name)
    assert text.returncode == 0 and f"`ddtreectl deploy {host.name} --restart` stops" in text.stdout, text.stdout

    # --restart: the old unit is stopped, disabled and deleted; the new one starts in its place,
    # enabled as the old one was, and passes the health gate.
    run = ddtreectl(inventory, "deploy", "--host", host.name, "--restart", "--json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    entry = host_doc(run)
    assert entry["units_removed"] == [OLD_UNIT] and entry["stale_running"] == [], entry
    assert entry["restarted"] is True and entry["restart_verified"] is True, entry
    assert not (host.root / "etc/systemd/system" / OLD_UNIT).exists()
    assert unit_state(host, OLD_UNIT)[0] == "inactive"
    assert unit_state(host, NEW_UNIT) == ("active", "enabled")
    (removed,) = [line for line in audit(host) if line["action"] == "unit-removed"]
    assert (removed["unit"], removed["was"], removed["replaced_by"]) == (OLD_UNIT, "active, enabled", NEW_UNIT)
    record = (host.root / "opt/ddtree/state/units.list").read_text().splitlines()
    assert [line.split()[0] for line in record] == [NEW_UNIT], record

    after = host_doc(ddtreectl(inventory, "status", host.name, "--json"))
    assert not [w for w in after["warnings"] if "stale unit" in w], after["warnings"]


def test_a_stopped_renamed_unit_is_removed_by_any_deploy(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    host, inventory = renamed_host(testbed, boot_hosts, tmp_path, "su-stop")
    host.systemctl("stop", OLD_UNIT)  # stopped, still enabled: it would come back at the next boot

    warnings = host_doc(ddtreectl(inventory, "status", host.name, "--json"))["warnings"]
    assert any(f"stale unit {OLD_UNIT} (inactive, enabled)" in w and f"`ddtreectl deploy {host.name}` disables"
               in w for w in warnings), warnings

    run = ddtreectl(inventory, "deploy", "--host", host.name, "--json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    entry = host_doc(run)
    assert entry["units_removed"] == [OLD_UNIT] and entry["restarted"] is False, entry
    assert not (host.root / "etc/systemd/system" / OLD_UNIT).exists()
    # The new unit takes over the boot-time start, not the running state (no --restart: nothing starts).
    assert unit_state(host, NEW_UNIT) == ("inactive", "enabled")
    assert [line["unit"] for line in audit(host) if line["action"] == "unit-removed"] == [OLD_UNIT]
