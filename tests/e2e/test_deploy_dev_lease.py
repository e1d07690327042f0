"""End-to-end: `deploy` and `rollback` on a host another operator holds for development, on a real
systemd + sshd test host through the installed CLI.

`mode HOST dev` gives the host to one operator, whose `run` works in the current release directory.
A deploy by someone else used to switch `current` under them (exit 0, the lease still saying dev).
Now, as restore-service does since session 7, deploy and rollback refuse such a host (exit 8) before
anything is built or switched, naming the holder, with `mode HOST prod` / taking the lease over as the
way on; --json says the same; `deploy --plan` shows it. The holder's own deploy goes through.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units, lay_out_built, stand_in_workspace

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

SERVICES = {"dl": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/dl",
                   "served_model_name": "dl", "unit_name": "ddtree-dl", "exec_start": "/bin/sleep infinity"}}
OLD = "a0a0a0a0a0a0"


def ddtreectl(inventory: Path, *args: str, user: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    # operator() is user@machine: two operators on this one machine differ by $USER.
    env = {**os.environ, "USER": user, "LOGNAME": user, "COLUMNS": "200"}
    return subprocess.run([exe, "-i", str(inventory), *args], capture_output=True, text=True, timeout=120, env=env)


def current_of(host: Any) -> str:
    return os.readlink(host.root / "opt/ddtree/current").rsplit("/", 1)[-1]


def audit_actions(host: Any) -> list[str]:
    log = host.root / "opt/ddtree/state/audit.log"
    return [json.loads(line)["action"] for line in log.read_text().splitlines()] if log.exists() else []


def test_deploy_and_rollback_refuse_a_host_held_for_development(testbed: Any, boot_hosts: Any,
                                                                tmp_path: Path) -> None:
    (host,) = boot_hosts(["dl-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={host.name: {"service": "dl", "role": "prod"}})
    new = stand_in_workspace(tmp_path)  # engine/ and templates/ beside the inventory: deploy ships these
    lay_out_built(host, OLD)
    lay_out_built(host, new)  # built before: a deploy only activates it (no compiler needed)
    host.sh(f"ln -sfn releases/{OLD} /opt/ddtree/current")
    install_service_units(inventory, host.name)

    # alice takes the host for development (no nvidia-smi on the test host: --force, recorded)
    took = ddtreectl(inventory, "mode", host.name, "dev", "--reason", "kernel bench", "--force", user="alice")
    assert took.returncode == 0, (took.stdout, took.stderr)
    before = audit_actions(host)

    # bob's deploy: refused before any build or switch, exit 8, the holder and the ways on named
    run = ddtreectl(inventory, "deploy", "--host", host.name, "--json", user="bob")
    assert run.returncode == 8, (run.stdout, run.stderr)
    doc = json.loads(run.stdout)
    assert (doc["exit_code"], doc["ok"]) == (8, False)
    (entry,) = doc["hosts"]
    assert entry["host"] == host.name and entry["ok"] is False and entry["release"] is None, entry
    error = entry["error"]
    assert error["exit_code"] == 8, error
    assert "held for development" in error["message"] and "alice@" in error["message"], error
    assert "kernel bench" in error["message"] and "nothing was changed" in error["message"], error
    assert f"`ddtreectl mode {host.name} prod`" in error["hint"] and "ask alice@" in error["hint"], error
    assert f"`ddtreectl mode {host.name} dev --reason ...`" in error["hint"], error
    assert doc["errors"][0]["exit_code"] == 8
    assert current_of(host) == OLD
    assert audit_actions(host) == before  # nothing happened on the host
    assert not (host.root / "opt/ddtree/state/locks/deploy.lock").exists()
    assert json.loads((host.root / "opt/ddtree/state/mode.json").read_text())["mode"] == "dev"

    text = ddtreectl(inventory, "deploy", "--host", host.name, user="bob")
    assert text.returncode == 8 and "held for development" in text.stderr and "hint:" in text.stderr, text.stderr
    assert current_of(host) == OLD

    plan = ddtreectl(inventory, "deploy", "--host", host.name, "--plan", "--json", user="bob")
    assert plan.returncode == 0, (plan.stdout, plan.stderr)
    (planned,) = json.loads(plan.stdout)["hosts"]
    assert "held for development" in planned["refused"] and "(exit 8)" in planned["refused"], planned

    # the holder's own deploy goes through: trying their engine is what the lease is for
    mine = ddtreectl(inventory, "deploy", "--host", host.name, "--json", user="alice")
    assert mine.returncode == 0, (mine.stdout, mine.stderr)
    assert current_of(host) == new
    assert json.loads((host.root / "opt/ddtree/state/mode.json").read_text())["holder"].startswith("alice@")
    mine_plan = ddtreectl(inventory, "deploy", "--host", host.name, "--plan", "--json", user="alice")
    assert json.loads(mine_plan.stdout)["hosts"][0]["refused"] is None

    # bob's rollback is refused the same way; `current` stays the holder's
    back = ddtreectl(inventory, "rollback", "--host", host.name, "--to", OLD, "--json", user="bob")
    assert back.returncode == 8, (back.stdout, back.stderr)
    (rolled,) = json.loads(back.stdout)["hosts"]
    assert rolled["error"]["exit_code"] == 8 and "alice@" in rolled["error"]["message"], rolled
    assert current_of(host) == new
