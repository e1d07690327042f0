"""End-to-end: `status` on a real sshd test host that answers, with its pinned key, but refuses the login
(a user it does not have, an identity file that does not exist). The table said "unreachable", and the
summary "did not answer: HOST (unreachable)", which sent operators to check a network that was fine;
the reason line below always said "authentication ... failed". Now the reach reads "login failed"; the
JSON's `outcome` keeps its documented value (`unreachable`) and the exit status stays 4."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]


def status(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), "status", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "120"})


@pytest.mark.testbed
def test_a_refused_login_is_said_as_such(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["login-host"])
    good = testbed.inventory([host], tmp_path / "hosts.yaml")
    assert status(good).returncode == 0
    for key, value, reason in (("user", "nosuchuser", "authentication as 'nosuchuser'"),
                               ("identity_file", str(tmp_path / "gone_ed25519"), "identity file")):
        doc = yaml.safe_load(good.read_text())
        doc["hosts"][host.name][key] = value
        bad = tmp_path / f"bad-{key}.yaml"
        bad.write_text(yaml.safe_dump(doc))
        for extra in ((), ("--no-reuse",)):
            run = status(bad, *extra)
            assert run.returncode == 4, run.stdout + run.stderr
            row = next(line for line in run.stdout.splitlines() if "reason below" in line)  # the host's row
            assert "login failed" in row and "unreachable" not in row, run.stdout
            assert f"{host.name}: {reason}" in run.stdout, run.stdout
            assert f"1 of 1 hosts did not answer: {host.name} (login failed)" in run.stderr, run.stderr
        (entry,) = json.loads(status(bad, "--json").stdout)["hosts"]
        assert (entry["outcome"], entry["error"]["exit_code"]) == ("unreachable", 4), entry
