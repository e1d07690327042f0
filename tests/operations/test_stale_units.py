"""Units the inventory no longer renders: the probe section's parse, the record, the status warning
and the removal script (pure parts; tests/e2e/test_deploy_stale_unit.py runs them on a real host)."""

from __future__ import annotations

from ddtreectl.operations import stale_units
from ddtreectl.probes.facts import OtherUnit
from ddtreectl.probes.status import parse_status_output
from ddtreectl.render.units import RenderedFile, RenderedService

PROBE = """@@ddtree-begin meta
hostname=h1
@@ddtree-end meta rc=0
@@ddtree-begin otherunits
unit=ddtree-old.service file=1 active=active enabled=enabled
unit=ddtree-gone.service file=0 active=inactive enabled=
unit=ddtree-off.service file=1 active=inactive enabled=disabled
unit=ddtree-ghost.service file=0 active=activating enabled=
@@ddtree-end otherunits rc=0
"""


def test_the_probe_lists_units_still_present_and_drops_the_ones_gone() -> None:
    facts = parse_status_output(PROBE, unit="ddtree-new.service")
    assert facts.other_units == (
        OtherUnit("ddtree-old.service", True, "active", "enabled"),
        OtherUnit("ddtree-off.service", True, "inactive", "disabled"),
        OtherUnit("ddtree-ghost.service", False, "activating", "unknown"),  # file deleted, process still up
    )
    assert [u.running for u in facts.other_units] == [True, False, True]


def test_an_older_probe_without_the_section_reports_none() -> None:
    assert parse_status_output(PROBE.split("@@ddtree-begin otherunits")[0], unit=None).other_units == ()


def test_the_warning_names_the_command_that_removes_the_unit() -> None:
    running = stale_units.status_warning("h1", OtherUnit("a.service", True, "active", "enabled"))
    assert "still running" in running and "`ddtreectl deploy h1 --restart`" in running
    stopped = stale_units.status_warning("h1", OtherUnit("a.service", True, "failed", "enabled"))
    assert "still running" not in stopped and "`ddtreectl deploy h1` disables and removes it" in stopped


def test_the_record_lists_the_rendered_unit_with_its_files_then_the_units_left_running() -> None:
    rendered = RenderedService("h1", "new.service", (RenderedFile("/etc/systemd/system/new.service", ""),
                                                     RenderedFile("/opt/ddtree/config/new.yaml", "")))
    assert stale_units.record_text(rendered, ["old.service"]) == (
        "new.service /etc/systemd/system/new.service /opt/ddtree/config/new.yaml\nold.service\n")
    assert stale_units.record_text(None, []) == ""


def test_the_removal_script_stops_disables_deletes_then_enables_the_replacement() -> None:
    script = stale_units._removal_script("/opt/ddtree", ["old.service"], "new.service\n", "new.service")
    lines = script.splitlines()
    assert lines[1] == ("systemctl disable --now -- old.service >/dev/null 2>&1 || systemctl stop -- old.service")
    assert lines[2] == "rm -f -- /etc/systemd/system/old.service /opt/ddtree/config/old.yaml"
    assert lines.index("systemctl daemon-reload") < lines.index("systemctl enable -- new.service >/dev/null 2>&1")
    assert "enable" not in stale_units._removal_script("/opt/ddtree", ["old.service"], "", "")
