"""End-to-end: every command that takes --json (README "JSON output"), through the INSTALLED CLI,
against a real systemd + sshd test host whose sshd was stopped (connects refused) and an inventory
host at an address of the test network where nothing answers (connects time out), plus ddtreectl's
own usage errors on both: stdout is exactly one JSON document with the command's schema, its
`exit_code` is the process's, the failure is in `error` (top level for one host, the host's entry for
a fan-out), the `error:`/`hint:` lines are on stderr, and the exit code is the README table's (4 for
a host that cannot be reached; `status` says 6 for any host that did not answer, as its --help
states; 2 for usage). tests/cli/test_json_shape.py walks the same commands on a local box."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
PROFILE = {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/jw",
           "served_model_name": "jw", "unit_name": "ddtree-jw", "exec_start": "/bin/sleep infinity"}

# (arguments with H for the host, schema, fan-out)
COMMANDS: list[tuple[list[str], str, bool]] = [
    (["status", "H"], "status", True),
    (["gpus", "H", "--samples", "1", "--interval", "0"], "gpus", True),
    (["deploy", "H"], "deploy", True),
    (["deploy", "--plan", "H"], "deploy-plan", True),
    (["rollback", "-H", "H"], "rollback", True),
    (["restore-service", "H"], "restore-service", True),
    (["logs", "H"], "logs", True),
    (["mode", "H"], "mode", False),
    (["mode", "H", "prod"], "mode", False),
    (["run", "H", "--", "true"], "run", False),
    (["render", "H", "--diff"], "render-diff", False),
    (["trust", "H"], "trust", False),
    (["lock", "status", "H"], "lock-status", False),
    (["set-ip", "H", "NEW"], "set-ip", False),
]
USAGE: list[tuple[list[str], str]] = [
    (["mode", "H", "foo"], "mode"), (["logs", "H", "-f"], "logs"), (["render", "H"], "render-diff"),
    (["deploy"], "deploy"), (["rollback"], "rollback"),
]


def ddtreectl(inventory: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    cut = args.index("--") if "--" in args else len(args)  # --json before a `run` command's `--`
    return subprocess.run([exe, "-i", str(inventory), *args[:cut], "--json", *args[cut:]], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})


def one_document(run: subprocess.CompletedProcess[str], schema: str) -> dict[str, Any]:
    assert "Traceback" not in run.stderr, run.stderr
    try:
        doc = json.loads(run.stdout)  # one JSON value and nothing else on stdout
    except ValueError:
        raise AssertionError(f"not one JSON document (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None
    assert (doc["schema"], doc["exit_code"], doc["ok"]) == (f"ddtreectl.{schema}/1", run.returncode, False), doc
    assert run.stderr.startswith("error: ") or "\nerror: " in run.stderr, run.stderr
    return dict(doc)


def failure_of(doc: dict[str, Any], host: str, fan_out: bool) -> dict[str, Any]:
    if fan_out:
        assert doc["error"] is None, doc  # the command ran; its one host failed
        (entry,) = doc["hosts"]
        assert (entry["host"], entry["ok"]) == (host, False), entry
        return dict(entry["error"])
    assert doc["host"] == host, doc
    return dict(doc["error"])


def test_every_json_command_on_unreachable_test_hosts(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (up,) = boot_hosts(["jw-nossh"])
    nowhere = testbed.new_address()  # in the test network's second subnet; no host has it
    inventory = testbed.inventory([up], tmp_path / "hosts.yaml", services={"jw": PROFILE},
                                  host_overrides={up.name: {"service": "jw", "connect_timeout": 2}})
    doc = yaml.safe_load(inventory.read_text())
    doc["hosts"]["jw-nowhere"] = {**doc["hosts"][up.name], "address": nowhere}
    inventory.write_text(yaml.safe_dump(doc, sort_keys=False))
    shutil.copytree(REPO / "templates", inventory.parent / "templates")
    up.stop_sshd()
    try:
        # Nobody at an address: ARP fails, so the connect times out or the kernel says no route.
        silent = ("connection timed out", "no route to host")
        for host, why in ((up.name, ("connection refused",)), ("jw-nowhere", silent)):
            for args, schema, fan_out in COMMANDS:
                argv = [host if a == "H" else testbed.new_address() if a == "NEW" else a for a in args]
                run = ddtreectl(inventory, argv)
                # One unreachable host: 4 for every command (status alone said 6).
                assert run.returncode == 4, (argv, run.returncode, run.stdout, run.stderr)
                error = failure_of(one_document(run, schema), host, fan_out)
                assert error["exit_code"] == 4 and error["hint"], (argv, error)
                # set-ip names what its NEW address (nobody there) did.
                assert any(w in error["message"] for w in (why if schema != "set-ip" else silent)), (argv, error)
            for args, schema in USAGE:
                argv = [host if a == "H" else a for a in args]
                run = ddtreectl(inventory, argv)
                assert run.returncode == 2, (argv, run.stdout, run.stderr)
                doc = one_document(run, schema)
                assert doc["error"]["exit_code"] == 2 and doc["error"]["hint"], (argv, doc)
    finally:
        up.start_sshd()
