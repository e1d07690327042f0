"""`--json` of the fan-out commands names EVERY targeted host, the ones that failed too.

`status --json` and `gpus --json` always did; `deploy --plan --json`, `rollback --json` and
`restore-service --json` printed only the hosts that succeeded (`{"hosts": []}`, `[]`), so a script
reading stdout could not tell an unreachable host from one that was never targeted. (Since session 7
every --json lists each targeted host under `hosts`, failed ones with `ok: false` and `error`.) The host here is
unreachable for real: an SSH host on a loopback port where nothing listens."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest


def _closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: connects are refused


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yaml"
    path.write_text(
        "services:\n  svc:\n    template: sglang-ddtree.service.j2\n    port: 30000\n"
        "    model_path: /models/x\n    served_model_name: x\n"
        f"hosts:\n  dead:\n    address: 127.0.0.1\n    port: {_closed_loopback_port()}\n    gpus: 0\n"
        "    connect_timeout: 2\n    role: prod\n    service: svc\n"
        f"  box:\n    transport: local\n    gpus: 0\n    remote_root: {tmp_path / 'root'}\n")
    return path


def ddtreectl(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    if exe is None:
        pytest.skip("ddtreectl is not installed (python3 -m pip install -e .)")
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)


def _dead(entries: list[dict[str, object]]) -> dict[str, object]:
    (dead,) = [e for e in entries if e["host"] == "dead"]
    return dead


@pytest.mark.parametrize("command", [["deploy", "--plan", "dead"], ["rollback", "-H", "dead"]])
def test_deploy_plan_and_rollback_json_list_the_unreachable_host(inventory: Path, command: list[str]) -> None:
    run = ddtreectl("-i", str(inventory), *command, "--json")
    assert run.returncode == 4, run.stderr
    doc = json.loads(run.stdout)
    (dead,) = doc["hosts"]  # every targeted host, as in every --json (README, "JSON output")
    assert (dead["host"], dead["ok"], dead["error"]["exit_code"]) == ("dead", False, 4)
    assert "connection refused" in dead["error"]["message"] and dead["error"]["hint"]
    assert dead["release"] is None and doc["exit_code"] == 4
    error = _dead(doc["errors"])  # the flat form deploy/rollback printed before, kept for scripts
    assert "connection refused" in str(error["error"]) and error["exit_code"] == 4 and error["hint"]


def test_restore_service_json_lists_every_host(inventory: Path) -> None:
    run = ddtreectl("-i", str(inventory), "restore-service", "dead", "box", "--json")
    assert run.returncode != 0 and "Traceback" not in run.stderr
    doc = json.loads(run.stdout)
    assert doc["schema"] == "ddtreectl.restore-service/1" and doc["exit_code"] == run.returncode
    assert sorted(e["host"] for e in doc["hosts"]) == ["box", "dead"]
    assert all(e["ok"] is False for e in doc["hosts"])
    error = _dead(doc["hosts"])["error"]
    assert isinstance(error, dict)
    assert "connection refused" in str(error["message"]) and error["exit_code"] == 4


def test_a_failed_hosts_entry_has_the_keys_of_an_answered_one(inventory: Path) -> None:
    """README "JSON output": a failed host's entry has an answered one's keys, null where only the host
    could answer (`gpus` used to leave them out: `entry["samples"]` was a KeyError for an unreachable
    host); inventory facts such as `unit` keep their value."""
    from ddtreectl.operations.restore import RestoreResult
    from ddtreectl.ui.logs_view import logs_json
    from ddtreectl.ui.units_view import restore_entry

    for command in (["gpus", "--samples", "1", "--interval", "0"], ["status"]):
        run = ddtreectl("-i", str(inventory), *command, "dead", "box", "--json")
        dead, box = json.loads(run.stdout)["hosts"]
        assert (dead["host"], dead["ok"], box["host"]) == ("dead", False, "box"), run.stdout
        assert set(dead) == set(box), (command, set(dead) ^ set(box))
        assert dead["error"]["exit_code"] == 4  # unreachable: 4 for every command (status said 6)
    assert [k for k, v in dead.items() if v is not None] == [  # status: what the inventory says, and that it failed
        "name", "host", "ok", "address", "port", "role", "transport", "outcome", "error", "warnings"], dead

    run = ddtreectl("-i", str(inventory), "gpus", "dead", "--json", "--samples", "1")
    (dead,) = json.loads(run.stdout)["hosts"]
    assert {k for k, v in dead.items() if v is not None} == {"name", "host", "ok", "verdict", "error"}, dead
    assert dead["verdict"] == "unknown"

    # Both hosts fail for restore-service and logs here: their entries against an answered one's shape.
    answered_restore = restore_entry(RestoreResult(host="box", unit="svc.service"))
    answered_logs = logs_json(["box"], {"box": "svc.service"}, {"box": ("svc.service", "")}, {}, 0)["hosts"][0]
    for command, answered in ((["restore-service"], answered_restore), (["logs"], answered_logs)):
        run = ddtreectl("-i", str(inventory), *command, "dead", "--json")
        (dead,) = json.loads(run.stdout)["hosts"]
        assert set(dead) == set(answered), (command, set(dead) ^ set(answered))
        assert (dead["unit"], dead["error"]["exit_code"]) == ("svc.service", 4), dead
