"""Pure parts of unit installation and drift detection (the real install runs in the e2e tests)."""

from __future__ import annotations

import base64

from ddtreectl.operations.units import InstalledState, drift, parse_installed
from ddtreectl.render.units import RenderedFile, RenderedService

UNIT = "/etc/systemd/system/demo.service"
CONF = "/opt/ddtree/config/demo.yaml"


def _rendered(unit_text: str = "[Service]\nExecStart=/bin/true\n") -> RenderedService:
    return RenderedService(host="h1", unit="demo.service",
                           files=(RenderedFile(UNIT, unit_text), RenderedFile(CONF, "port: 1\n")))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_parse_installed_reads_files_missing_files_dropins_and_reload_flag() -> None:
    edited, override = _b64("[Service]\nExecStart=/bin/false\n"), _b64("[Service]\nNice=5\n")
    output = (
        f"FILE {UNIT} {edited}\n"
        f"FILE {CONF} -\n"
        f"DROPIN /etc/systemd/system/demo.service.d/override.conf {override}\n"
        "NEEDRELOAD yes\n"
    )
    state = parse_installed(output)
    assert state.files == {UNIT: "[Service]\nExecStart=/bin/false\n", CONF: None}
    assert state.dropins == {"/etc/systemd/system/demo.service.d/override.conf": "[Service]\nNice=5\n"}
    assert state.need_daemon_reload is True


def test_drift_reports_each_kind_with_a_diff_for_hand_edits() -> None:
    rendered = _rendered()
    state = InstalledState(
        files={UNIT: "[Service]\nExecStart=/bin/false\n", CONF: None},
        dropins={"/run/systemd/system/demo.service.d/x.conf": "[Service]\n"},
        need_daemon_reload=True,
    )
    found = drift(rendered, state)
    assert [d.kind for d in found] == ["modified", "missing", "drop-in", "need-daemon-reload"]
    modified = found[0]
    assert "-ExecStart=/bin/false" in modified.diff and "+ExecStart=/bin/true" in modified.diff
    assert "h1:" in modified.diff


def test_no_drift_when_everything_matches() -> None:
    rendered = _rendered()
    state = InstalledState(files={f.path: f.content for f in rendered.files}, dropins={}, need_daemon_reload=False)
    assert drift(rendered, state) == []
