"""End-to-end: `deploy --restart` and `rollback --restart` verify the restarted service through
restore-service's health gate, on a real systemd + sshd test host with the engine's reference server.

The operator's story: a release whose server cannot start is deployed with --restart. It used to be
reported as "service restarted" (exit 0) while the unit crash-looped; then `rollback --restart` left
the crash-looping unit alone ("not running"). Both releases are laid out as built (the build itself
is test_deploy.py's subject), so deploy only activates them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ddtreectl.operations.release import release_id, walk_files
from tests.e2e.test_restore_service import REPO, UNIT, ddtreectl, profile

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

BROKEN_MAIN = 'import sys\nsys.exit("broken release: this server refuses to start")\n'


def workspace_release(workspace: Path, host: Any, *, broken: bool) -> str:
    """engine/ (a stand-in CMakeLists and the engine's real Python package) and templates/ under
    `workspace`; the release a deploy computes for them is laid out on `host` as built."""
    engine = workspace / "engine"
    if not engine.exists():
        engine.mkdir()
        (engine / "CMakeLists.txt").write_text("# stand-in: releases are laid out as built\n")
        shutil.copytree(REPO / "engine/python", engine / "python",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copytree(REPO / "templates", workspace / "templates")
    main = engine / "python/ddtree_engine/serve/__main__.py"
    if broken:
        main.write_text(BROKEN_MAIN)
    else:
        shutil.copyfile(REPO / "engine/python/ddtree_engine/serve/__main__.py", main)
    files = walk_files(engine) + walk_files(workspace / "templates", "templates/")
    rid = release_id(files, {"cuda_archs": "", "cmake_args": []})
    target = host.root / "opt/ddtree/releases" / rid
    shutil.copytree(engine / "python", target / "python")
    (target / ".build-stamp").write_text(json.dumps({"id": rid, "selftest": "skipped: no GPU"}) + "\n")
    return rid


def doc(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(run.stdout)["hosts"][0])
    except ValueError:
        raise AssertionError(f"not JSON (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None


def running_release(inventory: Path) -> str | None:
    run = ddtreectl("-i", str(inventory), "status", "rv-main", "--json")
    return doc(run)["release"]["running"]  # type: ignore[no-any-return]


@pytest.mark.testbed
def test_restart_is_verified_and_rollback_restarts_a_crash_looping_service(
        boot_hosts: Any, testbed: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["rv-main"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services={"ref": profile()},
                                  host_overrides={"rv-main": {"service": "ref", "role": "prod"}})
    inv = str(inventory)
    good = workspace_release(tmp_path, host, broken=False)
    run = ddtreectl("-i", inv, "deploy", "rv-main", "--json")
    assert run.returncode == 0, run.stderr
    run = ddtreectl("-i", inv, "restore-service", "rv-main", "--json")
    assert run.returncode == 0, run.stderr
    assert running_release(inventory) == good

    # A release whose server exits at once: the restart must not pass as a success.
    bad = workspace_release(tmp_path, host, broken=True)
    # Without --restart the deploy itself says the running service is still on the old release.
    run = ddtreectl("-i", inv, "deploy", "rv-main", "--json")
    assert run.returncode == 0, run.stderr
    assert (doc(run)["action"], doc(run)["still_running"], doc(run)["restarted"]) == ("activated", good, False)
    run = ddtreectl("-i", inv, "deploy", "rv-main")
    assert f"restart pending: the service still runs {good} (`ddtreectl deploy rv-main --restart`" in run.stdout
    run = ddtreectl("-i", inv, "deploy", "rv-main", "--restart", "--json")
    entry = doc(run)
    assert run.returncode == 5, (run.stdout, run.stderr)
    assert entry["ok"] is False and entry["error"]["exit_code"] == 5
    message, hint = entry["error"]["message"], entry["error"]["hint"]
    assert f"`current` is {bad}; {UNIT} was restarted on it but is not healthy" in message
    assert "broken release: this server refuses to start" in message  # this start's journal lines
    assert f"rollback --host rv-main --to {good} --restart" in hint
    assert os.readlink(host.root / "opt/ddtree/current").rsplit("/", 1)[-1] == bad  # moved: the error says so
    audit = (host.root / "opt/ddtree/state/audit.log").read_text().splitlines()
    assert json.loads(audit[-1])["restart_failed"]

    # The unit now crash-loops between Restart= attempts: rollback --restart must restart it on the
    # good release and verify it (it used to count it as "not running" and leave it).
    sub = host.systemctl("show", "-p", "SubState", "--value", UNIT, check=False).stdout.strip()
    active = host.systemctl("is-active", UNIT, check=False).stdout.strip()
    assert (active, sub) == ("activating", "auto-restart")
    run = ddtreectl("-i", inv, "rollback", "--host", "rv-main", "--restart", "--json")
    entry = doc(run)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert entry["release"] == good and entry["restarted"] is True and entry["restart_verified"] is True
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"
    assert running_release(inventory) == good

    # A stopped unit is left stopped (restore-service starts it), and the result says so.
    host.systemctl("stop", UNIT)
    run = ddtreectl("-i", inv, "rollback", "--host", "rv-main", "--to", bad, "--restart", "--json")
    entry = doc(run)
    assert run.returncode == 0, (run.stdout, run.stderr)
    assert entry["restarted"] is False and entry["restart_verified"] is False
    assert "not running" in entry["restart_note"] and "restore-service rv-main" in entry["restart_note"]
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
