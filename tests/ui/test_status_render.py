"""Table and JSON rendering of a status report built from real probe output (fixtures)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from ddtreectl.inventory.models import Host
from ddtreectl.operations.status import HostStatus, StatusReport
from ddtreectl.probes.checks import warnings_for
from ddtreectl.probes.status import parse_status_output
from ddtreectl.ui.status_json import report_to_json
from ddtreectl.ui.status_table import render_status

from tests.probes.fixtures import fixture

FAILED = Host(name="gpu-a", address="10.0.0.5", gpus=8, service="fx")
DOWN = Host(name="ct200", address="10.1.230.171", gpus=8, role="prod")


def make_report() -> StatusReport:
    facts = parse_status_output(fixture("probe-testbed-failed.txt"), unit="fx-failed.service")
    return StatusReport((
        HostStatus(FAILED, "ok", facts=facts, connect_ms=120.0, probe_ms=41.5,
                   warnings=tuple(warnings_for(FAILED, facts))),
        HostStatus(DOWN, "unreachable", error="cannot reach 10.1.230.171:22: timed out after 5 s",
                   hint="check the address"),
    ), 20.0, 5.1)


def test_table_says_each_state_in_words() -> None:
    out = io.StringIO()
    render_status(make_report(), Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "fx-failed: failed (result exit-code, exit status 3, 0 restarts)" in text
    assert "nvidia-smi missing (expected 8 GPUs)" in text
    assert "ok 42 ms" in text and "r2" in text
    assert "unreachable" in text and "1/2 hosts answered" in text
    assert "ct200: cannot reach 10.1.230.171:22: timed out after 5 s" in text
    assert "hint: check the address" in text


def test_json_schema_fields() -> None:
    doc = report_to_json(make_report(), Path("hosts.yaml"))
    assert doc["schema"] == "ddtreectl.status/1" and doc["exit_code"] == 6
    assert doc["summary"] == {"hosts": 2, "answered": 1, "unreachable": 1, "refused": 0,
                              "timeout": 0, "failed": 0}
    a, down = doc["hosts"]
    assert a["service"]["state"] == "failed" and a["service"]["exec_main_status"] == 3
    assert a["service"]["profile"] == "fx" and a["service"]["active_since"].endswith("+00:00")
    assert a["gpus"]["busy"] is None and a["gpus"]["status"] == "missing"
    assert a["state_files"] == {"state/mode.json": {"owner": "ana", "mode": "dev"}}
    assert a["release"]["stamp"] is None  # the stamp file exists but is empty
    assert down["identity"] is None and down["error"] == {
        "message": "cannot reach 10.1.230.171:22: timed out after 5 s", "hint": "check the address", "exit_code": 4}  # as `status ct200` alone exits
    json.dumps(doc)  # plain JSON types only


def test_80_columns_gives_one_block_per_host_with_whole_phrases() -> None:
    """At 80 columns (a narrow terminal over SSH, or a pipe) the seven-column table wrapped every
    state into a column of one or two words ("fx-failed:" / "failed" / "(result" / "exit-code," ...
    over eight lines). Now a host that the table cannot show readably gets a block: its name, address
    and reach on one line, then one labelled line each for GPUs, service (and mode), release and
    warnings, each phrase whole. Nothing is dropped; wide terminals keep the table."""
    out = io.StringIO()
    render_status(make_report(), Console(file=out, width=80, color_system=None))
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 80 and line == line.rstrip() for line in lines), out.getvalue()
    text = "\n".join(lines)
    assert lines[0].split() == ["gpu-a", "10.0.0.5", "ok", "42", "ms"], text
    assert "  GPUs      no nvidia-smi" in lines, text
    assert "  service   fx-failed: failed (result exit-code, exit status 3, 0 restarts)" in lines, text
    assert "            mode dev: ? until ?: no reason" in lines, text
    assert "  release   r2" in lines, text
    assert "  warnings  nvidia-smi missing (expected 8 GPUs)" in lines, text
    assert "ct200  10.1.230.171  unreachable" in lines and "  reason below" in lines, text
    assert "1/2 hosts answered" in text and "ct200: cannot reach 10.1.230.171:22: timed out after 5 s" in text

    wide = io.StringIO()
    render_status(make_report(), Console(file=wide, width=200, color_system=None))
    header = wide.getvalue().splitlines()[1].replace("┃", " ").split()
    assert header == ["host", "address", "reach", "GPUs", "service", "release", "warnings"], wide.getvalue()
