"""End-to-end: `restore-service` and `mode HOST prod` on a host where a unit of an older name (the
profile's `unit_name` changed) is still installed, on real systemd + sshd test hosts through the
installed CLI.

Both used to start the rendered unit beside the old one: two servers fighting for the port and the
GPUs, and, with the old one enabled, again at every boot. Only `deploy` removed such units. Now a
running old unit is a refusal before anything starts (exit 5, --force included: it is the serving
process, and neither command stops a running service), naming it and the commands that clear it; a
stopped one is removed (disabled, deleted, audited) before the start, as any deploy would.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units
from tests.e2e.test_deploy_stale_unit import (NEW_UNIT, OLD_UNIT, audit, ddtreectl, host_doc, renamed_host,
                                             unit_state)
from tests.e2e.test_mode import SERVICES, UNIT, as_json, lay_out_release, lease, nvidia_smi_stand_in
from tests.e2e.test_mode import ddtreectl as ddtreectl_as

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def host_with_old_md_unit(testbed: Any, boot_hosts: Any, tmp_path: Path, name: str,
                          *enable: str) -> tuple[Any, Path]:
    """A prod host (one stand-in GPU) whose profile first rendered unit md-old (`systemctl *enable` applied to it),
    then the inventory renamed it to UNIT and the new unit was installed: (host, inventory path)."""
    (host,) = boot_hosts([name], gpus_stub={name: nvidia_smi_stand_in()})
    overrides = {host.name: {"service": "ref", "role": "prod", "gpus": 1}}
    old = {"ref": {**SERVICES["ref"], "unit_name": "md-old", "exec_start": "/bin/sleep infinity"}}
    path = testbed.inventory([host], tmp_path / "hosts.yaml", services=old, host_overrides=overrides)
    shutil.copytree(REPO / "templates", path.parent / "templates")
    lay_out_release(host)
    install_service_units(path, host.name)
    host.systemctl(*enable, "md-old.service")
    testbed.inventory([host], path, services=SERVICES, host_overrides=overrides)  # the unit is UNIT now
    install_service_units(path, host.name)
    return host, path


def test_restore_service_refuses_beside_a_running_old_unit_and_removes_a_stopped_one(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    host, inventory = renamed_host(testbed, boot_hosts, tmp_path, "rs-stale")
    install_service_units(inventory, host.name)  # the rendered unit is installed, not started
    assert unit_state(host, NEW_UNIT) == ("inactive", "disabled")

    for extra in ([], ["--force"]):
        run = ddtreectl(inventory, "restore-service", host.name, "--json", *extra)
        assert run.returncode == 5, (extra, run.stdout, run.stderr)
        error = host_doc(run)["error"]
        assert f"{OLD_UNIT} (active, enabled)" in error["message"] and "still running" in error["message"], error
        assert f"systemctl disable --now {OLD_UNIT}" in error["hint"], error
        assert f"`ddtreectl deploy {host.name} --restart`" in error["hint"], error
        # Nothing was started, enabled or removed.
        assert unit_state(host, OLD_UNIT) == ("active", "enabled")
        assert unit_state(host, NEW_UNIT) == ("inactive", "disabled")
    text = ddtreectl(inventory, "restore-service", host.name)
    assert text.returncode == 5 and f"stale unit {OLD_UNIT} (active, enabled)" in text.stderr, text.stderr

    # Stopped (still enabled: it would start again at boot beside the new one): removed first.
    host.systemctl("stop", OLD_UNIT)
    run = ddtreectl(inventory, "restore-service", host.name, "--json")
    assert run.returncode == 0, (run.stdout, run.stderr)
    entry = host_doc(run)
    assert entry["units_removed"] == [OLD_UNIT] and entry["started"] is True, entry
    assert any(f"removed stale unit {OLD_UNIT} (inactive, enabled)" in w for w in entry["warnings"]), entry
    assert not (host.root / "etc/systemd/system" / OLD_UNIT).exists()
    assert unit_state(host, OLD_UNIT)[1] != "enabled"
    assert unit_state(host, NEW_UNIT) == ("active", "enabled")
    (removed,) = [line for line in audit(host) if line["action"] == "unit-removed"]
    assert (removed["unit"], removed["was"], removed["replaced_by"]) == (OLD_UNIT, "inactive, enabled", NEW_UNIT)
    record = (host.root / "opt/ddtree/state/units.list").read_text().splitlines()
    assert [line.split()[0] for line in record] == [NEW_UNIT], record
    after = host_doc(ddtreectl(inventory, "status", host.name, "--json"))
    assert not [w for w in after["warnings"] if "stale unit" in w], after["warnings"]


def test_mode_prod_keeps_the_lease_beside_a_running_old_unit_and_removes_a_stopped_one(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    host, path = host_with_old_md_unit(testbed, boot_hosts, tmp_path, "mp-stale", "enable", "--now")
    i = str(path)
    dev = ddtreectl_as("-i", i, "mode", host.name, "dev", "--reason", "bench")
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert lease(host)["mode"] == "dev"

    doc = as_json(ddtreectl_as("-i", i, "mode", host.name, "prod", "--json"))
    assert (doc["exit_code"], doc["ok"]) == (5, False), doc
    assert "md-old.service (active, enabled)" in doc["error"]["message"], doc
    assert "systemctl disable --now md-old.service" in doc["error"]["hint"], doc
    assert lease(host)["mode"] == "dev"  # nothing started: the lease is still the truth
    assert unit_state(host, UNIT) == ("inactive", "disabled")
    assert unit_state(host, "md-old.service") == ("active", "enabled")

    host.systemctl("stop", "md-old.service")
    doc = as_json(ddtreectl_as("-i", i, "mode", host.name, "prod", "--json"))
    assert (doc["exit_code"], doc["ok"]) == (0, True), doc
    assert doc["restore"]["units_removed"] == ["md-old.service"], doc
    assert any("removed stale unit md-old.service (inactive, enabled)" in w for w in doc["warnings"]), doc
    assert lease(host)["mode"] == "prod"
    assert unit_state(host, UNIT) == ("active", "enabled")
    assert not (host.root / "etc/systemd/system/md-old.service").exists()
    assert unit_state(host, "md-old.service")[1] != "enabled"


def refuse_start(host: Any, unit: str) -> None:
    """An operator's drop-in under which systemd refuses the start (let through by --force as drift)."""
    host.sh(f"mkdir -p /etc/systemd/system/{unit}.d && "
            f"printf '[Unit]\\nRefuseManualStart=yes\\n' > /etc/systemd/system/{unit}.d/hold.conf")
    host.systemctl("daemon-reload")


def test_a_start_that_fails_after_the_removal_still_reports_the_removed_unit(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    """The old unit is removed, then systemd refuses the new unit's start: the --json document used to
    say `units_removed: []` (restore-service) or `restore: null` (mode prod), and the text output
    nothing, though the old unit was gone from the host."""
    host, inventory = renamed_host(testbed, boot_hosts, tmp_path, "rs-stfail")
    install_service_units(inventory, host.name)
    host.systemctl("stop", OLD_UNIT)
    refuse_start(host, NEW_UNIT)
    run = ddtreectl(inventory, "restore-service", host.name, "--force", "--json")
    assert run.returncode == 5, (run.stdout, run.stderr)
    entry = host_doc(run)
    assert f"starting {NEW_UNIT} failed" in entry["error"]["message"], entry
    assert (entry["ok"], entry["started"], entry["units_removed"]) == (False, False, [OLD_UNIT]), entry
    assert entry["enabled"] is True and unit_state(host, NEW_UNIT) == ("inactive", "enabled"), entry
    assert any(f"removed stale unit {OLD_UNIT}" in w for w in entry["warnings"]), entry
    assert not (host.root / "etc/systemd/system" / OLD_UNIT).exists()

    # The text output says it too (its warnings used to be printed only for a host that reached the gate).
    (tmp_path / "text").mkdir()
    host, inventory = renamed_host(testbed, boot_hosts, tmp_path / "text", "rs-stfail-t")
    install_service_units(inventory, host.name)
    host.systemctl("stop", OLD_UNIT)
    refuse_start(host, NEW_UNIT)
    text = ddtreectl(inventory, "restore-service", host.name, "--force")
    assert text.returncode == 5 and f"starting {NEW_UNIT} failed" in text.stderr, (text.stdout, text.stderr)
    assert f"{host.name}: warning: removed stale unit {OLD_UNIT}" in " ".join(text.stdout.split()), text.stdout


def test_mode_prod_whose_start_fails_after_the_removal_reports_it(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    # md-old stopped but enabled: it would start at the next boot
    host, path = host_with_old_md_unit(testbed, boot_hosts, tmp_path, "mp-stfail", "enable")
    i = str(path)
    assert ddtreectl_as("-i", i, "mode", host.name, "dev", "--reason", "bench").returncode == 0
    refuse_start(host, UNIT)

    doc = as_json(ddtreectl_as("-i", i, "mode", host.name, "prod", "--force", "--json"))
    assert (doc["exit_code"], doc["ok"], doc["lease_kept"]) == (5, False, True), doc
    assert doc["restore"] is not None, doc
    assert (doc["restore"]["ok"], doc["restore"]["started"]) == (False, False), doc
    assert doc["restore"]["units_removed"] == ["md-old.service"], doc
    assert doc["restore"]["failure"]["phase"] == "start" and f"starting {UNIT} failed" in \
        doc["restore"]["failure"]["reason"], doc
    assert any("removed stale unit md-old.service" in w for w in doc["warnings"]), doc
    assert lease(host)["mode"] == "dev" and unit_state(host, UNIT) == ("inactive", "disabled")
    assert not (host.root / "etc/systemd/system/md-old.service").exists()
    last = audit(host)[-1]
    assert (last["action"], last["failed_phase"], last["units_removed"]) == ("mode", "start", ["md-old.service"])
