"""End-to-end: `restore-service --json` whose restore an error ends half way, after it had changed the
host, on a real systemd + sshd test host through the installed CLI.

A stopped unit of an older name is removed (stopped, disabled, deleted, audited) and the rendered
unit enabled before the start. When the start then timed out and the unit's state could not be read
afterwards, or the connection dropped during the start, the host's entry said `units_removed: []`,
`enabled: false`: only a failed enable/start (ServiceStartError) carried what was done, while the
audit log on the host had the removal. Now the entry keeps the restore's own record of what it
changed, whatever error ended it; `started` is null where the start was sent and the error came
before it was known whether it took.

The slow client is a `systemctl` in /usr/local/bin (ahead of /usr/bin on the SSH user's PATH) that
only misbehaves once /run/misbehave names what to do; systemd, sshd and the units are real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, reference_service
from tests.e2e.test_deploy_stale_unit import NEW_UNIT, OLD_UNIT, audit, ddtreectl, host_doc, renamed_host, unit_state

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

COMMAND_TIMEOUT = 6  # the host's command_timeout: bounds `systemctl start` and the state read after it
# "hang": a start never reaches systemd, and every `systemctl show` after it hangs too (state unreadable).
# "drop": a start reaches systemd, then the SSH connection it came in on is killed (its sshd processes,
# found by walking up from this process; the listener, whose parent is PID 1, stays).
MISBEHAVING_SYSTEMCTL = """#!/bin/sh
mode=$(cat /run/misbehave 2>/dev/null)
case " $* " in *" start "*|*" restart "*) verb=start ;; *" show "*) verb=show ;; *) verb= ;; esac
case "$mode:$verb" in
  hang:start) touch /run/start-sent; sleep 600; exit 1 ;;
  hang:show) [ -e /run/start-sent ] && { sleep 600; exit 1; } ;;
  drop:start)
    /usr/bin/systemctl "$@"
    pid=$$ victims=
    while [ "$pid" -gt 1 ]; do
      ppid=$(awk '/^PPid:/ {print $2}' /proc/$pid/status)
      [ "$(cat /proc/$pid/comm)" = sshd ] && [ "$ppid" != 1 ] && victims="$victims $pid"
      pid=$ppid
    done
    kill -9 $victims; sleep 600; exit 1 ;;
esac
exec /usr/bin/systemctl "$@"
"""


def host_with_stopped_old_unit(testbed: Any, boot_hosts: Any, tmp_path: Path, name: str, mode: str) -> tuple[Any, Path]:
    """A prod host whose profile renamed its unit: OLD_UNIT installed, enabled and stopped, NEW_UNIT installed
    (disabled), command_timeout short, and the misbehaving systemctl set to `mode`."""
    host, inventory = renamed_host(testbed, boot_hosts, tmp_path, name)
    testbed.inventory([host], inventory, services={"sv": reference_service("ddtree-new", "sv")},
                      host_overrides={host.name: {"service": "sv", "role": "prod", "command_timeout": COMMAND_TIMEOUT}})
    install_service_units(inventory, host.name)
    host.systemctl("stop", OLD_UNIT)
    assert unit_state(host, OLD_UNIT) == ("inactive", "enabled") and unit_state(host, NEW_UNIT)[1] == "disabled"
    host.write_file("/usr/local/bin/systemctl", MISBEHAVING_SYSTEMCTL, mode=0o755)
    host.write_file("/run/misbehave", mode)
    return host, inventory


def assert_removal_reported(host: Any, entry: dict[str, Any]) -> None:
    assert entry["ok"] is False and entry["units_removed"] == [OLD_UNIT], entry
    assert entry["enabled"] is True, entry  # the rendered unit was enabled in the old one's place
    assert any(f"removed stale unit {OLD_UNIT} (inactive, enabled)" in w for w in entry["warnings"]), entry
    # ... which is what the host says, too
    assert not (host.root / "etc/systemd/system" / OLD_UNIT).exists()
    assert host.sh(f"/usr/bin/systemctl is-enabled {NEW_UNIT}", check=False).stdout.strip() == "enabled"
    assert [line["unit"] for line in audit(host) if line["action"] == "unit-removed"] == [OLD_UNIT]


def restore_broken_off(testbed: Any, boot_hosts: Any, tmp_path: Path, name: str, mode: str, code: int,
                       words: str) -> tuple[Any, Path]:
    """`restore-service --json` on a host_with_stopped_old_unit(mode): it ends with exit `code` and an error
    saying `words`, and the host's entry says what was changed before (the start: sent, unconfirmed)."""
    host, inventory = host_with_stopped_old_unit(testbed, boot_hosts, tmp_path, name, mode)
    run = ddtreectl(inventory, "restore-service", host.name, "--json")
    assert run.returncode == code, (run.stdout, run.stderr)
    entry = host_doc(run)
    assert words in entry["error"]["message"], entry
    assert_removal_reported(host, entry)
    assert entry["started"] is None, entry  # sent, never confirmed either way
    return host, inventory


def test_a_start_that_timed_out_with_its_state_unreadable_still_reports_what_was_changed(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    host, inventory = restore_broken_off(testbed, boot_hosts, tmp_path, "rp-unread", "hang", 5,
                                         "its state could not be read afterwards")
    # The text output says it as well: a second try (nothing left to remove) that ends the same way.
    host.sh("rm -f /run/start-sent")
    text = ddtreectl(inventory, "restore-service", host.name)
    assert text.returncode == 5, (text.stdout, text.stderr)
    assert f"{host.name}: warning: done before the error: enabled {NEW_UNIT}, sent the start of {NEW_UNIT} " \
           "(whether it took is unknown)" in " ".join(text.stdout.split()), text.stdout


def test_a_connection_dropped_during_the_start_still_reports_what_was_changed(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    """Paramiko read the dropped connection as the start's exit status -1: "starting ... failed (exit -1)",
    exit 5, `started: false`, though the start had reached systemd. Now it is a lost connection (4)."""
    host, _ = restore_broken_off(testbed, boot_hosts, tmp_path, "rp-drop", "drop", 4, "connection lost")
    assert host.sh(f"/usr/bin/systemctl is-active {NEW_UNIT}", check=False).stdout.strip() in ("active", "activating")


def test_mode_prod_whose_start_broke_off_reports_the_removed_unit(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    """`mode HOST prod` restores through the same code: its document said `restore: null` (the removal
    lost) and its text output only the error."""
    from tests.e2e.test_mode import SERVICES, lease
    from tests.e2e.test_mode import ddtreectl as ddtreectl_as
    from tests.e2e.test_restore_stale_unit import host_with_old_md_unit

    host, path = host_with_old_md_unit(testbed, boot_hosts, tmp_path, "rp-mode", "enable")
    testbed.inventory([host], path, services=SERVICES, host_overrides={
        host.name: {"service": "ref", "role": "prod", "gpus": 1, "command_timeout": COMMAND_TIMEOUT}})
    assert ddtreectl_as("-i", str(path), "mode", host.name, "dev", "--reason", "bench").returncode == 0
    host.write_file("/usr/local/bin/systemctl", MISBEHAVING_SYSTEMCTL, mode=0o755)
    host.write_file("/run/misbehave", "hang")

    run = ddtreectl_as("-i", str(path), "mode", host.name, "prod", "--json")
    assert run.returncode == 5, (run.stdout, run.stderr)
    doc = json.loads(run.stdout)
    assert "its state could not be read afterwards" in doc["error"]["message"], doc
    assert doc["restore"] == {"ok": False, "started": None, "duration_s": None,
                              "units_removed": ["md-old.service"], "failure": None}, doc
    assert any("removed stale unit md-old.service" in w for w in doc["warnings"]), doc
    assert not (host.root / "etc/systemd/system/md-old.service").exists()
    assert lease(host)["mode"] == "dev"  # the switch broke off before it could end the lease
