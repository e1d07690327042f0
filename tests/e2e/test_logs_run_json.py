"""End-to-end: `logs --json` and `run --json` on real systemd + sshd test hosts through the installed CLI.

Scripts had to scrape `logs` (journalctl's short-iso text, host prefixes) and `run` (output mixed with
ddtreectl's own lines, the status only in $?). Both now print the one document of README "JSON
output": `ddtreectl.logs/1` (every target in order, its unit and journal entries from `journalctl -o
json`, failed hosts with `error`) and `ddtreectl.run/1` (the command's status and output lines).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

PROFILE = {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/lj",
           "served_model_name": "lj", "unit_name": "ddtree-lj",
           "exec_start": "/usr/local/bin/lj-serve"}
# The third line is not UTF-8: journalctl -o json gives its MESSAGE as an array of byte values.
SERVER = "#!/bin/sh\necho first line\necho 'second: café' >&2\nprintf 'bad \\377 byte\\n'\nexec sleep infinity\n"


def ddtreectl(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


def document(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    try:
        return dict(json.loads(run.stdout))
    except ValueError:
        raise AssertionError(f"not one JSON document (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None


def test_logs_and_run_json_on_real_hosts(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    from tests.e2e.host_setup import install_service_units

    served, bare = boot_hosts(["lj-served", "lj-bare"])
    inventory = testbed.inventory([served, bare], tmp_path / "hosts.yaml", services={"lj": PROFILE},
                                  host_overrides={served.name: {"service": "lj"}})
    served.write_file("/usr/local/bin/lj-serve", SERVER, mode=0o755)
    (served.root / "opt/ddtree/releases/r1").mkdir(parents=True)  # the unit's working directory
    served.sh("ln -sfn releases/r1 /opt/ddtree/current")
    install_service_units(inventory, served.name)
    # Installed, never started: journalctl's bare "-- No entries --" read like a failure.
    never = ddtreectl(inventory, "logs", served.name)
    assert never.returncode == 0 and never.stdout == (
        "no journal entries for ddtree-lj.service yet (not started since boot, or no journal is kept)\n"), never
    served.systemctl("start", "ddtree-lj.service")
    deadline = time.monotonic() + 30
    while "bad" not in served.journal("ddtree-lj.service") and time.monotonic() < deadline:
        time.sleep(0.2)

    run = ddtreectl(inventory, "logs", served.name, "--json", "-n", "50")
    assert run.returncode == 0, (run.stdout, run.stderr)
    doc = document(run)
    assert (doc["schema"], doc["exit_code"], doc["ok"], doc["error"]) == ("ddtreectl.logs/1", 0, True, None), doc
    (entry,) = doc["hosts"]
    assert (entry["host"], entry["ok"], entry["unit"], entry["error"]) == (served.name, True, "ddtree-lj.service", None)
    messages = [e["message"] for e in entry["entries"]]
    assert "first line" in messages and "second: café" in messages and "bad \ufffd byte" in messages, messages
    first = entry["entries"][messages.index("first line")]
    assert first["identifier"] == "lj-serve" and isinstance(first["pid"], int) and first["priority"] == 6, first
    assert first["time"].endswith("Z") and abs(first["unix_us"] / 1e6 - time.time()) < 600, first
    assert messages.index("first line") < messages.index("second: café")  # oldest first
    assert run.stderr == ""

    # Every target is listed, in order, the failed one with its error: a partial failure (6).
    run = ddtreectl(inventory, "logs", bare.name, served.name, "--json")
    assert run.returncode == 6, (run.stdout, run.stderr)
    doc = document(run)
    assert (doc["exit_code"], doc["ok"], [h["host"] for h in doc["hosts"]]) == (6, False, [bare.name, served.name])
    failed, shown = doc["hosts"]
    assert (failed["ok"], failed["entries"], failed["unit"]) == (False, None, None), failed
    assert failed["error"]["exit_code"] == 3 and "runs no service profile" in failed["error"]["message"], failed
    assert shown["ok"] is True and "first line" in [e["message"] for e in shown["entries"]]

    # `logs all`: a host with no service has no journal; the fleet-wide run shows the others and
    # says so, and does not fail for it (it was exit 6). Named alone, it stays an error (above: 3).
    every = ddtreectl(inventory, "logs", "all", "--json")
    assert every.returncode == 0, (every.stdout, every.stderr)
    doc = document(every)
    skipped, shown = {h["host"]: h for h in doc["hosts"]}[bare.name], {h["host"]: h for h in doc["hosts"]}[served.name]
    assert (doc["exit_code"], doc["ok"], [h["host"] for h in doc["hosts"]]) == (0, True, [served.name, bare.name])
    assert (skipped["ok"], skipped["entries"], skipped["error"], skipped["skipped"]) == \
        (True, [], None, "no service profile"), skipped
    assert shown["skipped"] is None and "first line" in [e["message"] for e in shown["entries"]], shown
    text = ddtreectl(inventory, "logs", "all")
    assert text.returncode == 0, (text.stdout, text.stderr)
    assert f"{served.name}: " in text.stdout and "first line" in text.stdout, text.stdout
    assert text.stderr == f"{bare.name}: skipped: runs no service profile, no journal to show\n", text.stderr

    bad = ddtreectl(inventory, "logs", served.name, "--json", "--since", "not-a-time")
    doc = document(bad)
    assert (bad.returncode, doc["exit_code"], doc["hosts"][0]["error"]["exit_code"]) == (5, 5, 5), doc
    assert "journalctl failed" in doc["hosts"][0]["error"]["message"]
    follow = ddtreectl(inventory, "logs", served.name, "--json", "-f")
    assert follow.returncode == 2 and "--json cannot follow" in follow.stderr
    assert document(follow)["error"]["exit_code"] == 2  # the refusal is the one document

    # run over SSH: refused without a lease (the document carries the refusal), --force runs it.
    refused = ddtreectl(inventory, "run", served.name, "--json", "--", "true")
    doc = document(refused)
    assert (refused.returncode, doc["schema"], doc["exit_code"], doc["ok"], doc["host"]) == \
        (7, "ddtreectl.run/1", 7, False, served.name), doc
    assert "production mode" in doc["error"]["message"], doc
    ran = ddtreectl(inventory, "run", served.name, "--force", "--json", "--",
                    "sh", "-c", "pwd -P; echo to-stderr >&2; exit 3")
    assert ran.returncode == 3, (ran.stdout, ran.stderr)
    doc = document(ran)
    assert (doc["exit_code"], doc["ok"], doc["error"], doc["command_exit_code"]) == (3, False, None, 3), doc
    assert doc["output"] == ["/opt/ddtree/releases/r1", "to-stderr"], doc
    assert doc["command"] == "sh -c 'pwd -P; echo to-stderr >&2; exit 3'" and doc["duration_s"] >= 0, doc
    assert doc["timed_out"] is False, doc

    # Killed at --timeout: the document keeps what the command printed until then (the error boundary's
    # document used to replace it: no output at all), its last line without a newline too.
    cut = ddtreectl(inventory, "run", served.name, "--force", "--json", "--timeout", "3", "--",
                    "sh", "-c", "echo before; echo on-stderr >&2; printf partial; sleep 60")
    assert cut.returncode == 5, (cut.stdout, cut.stderr)
    doc = document(cut)
    assert (doc["exit_code"], doc["ok"], doc["timed_out"], doc["command_exit_code"]) == (5, False, True, None), doc
    assert doc["output"] == ["before", "on-stderr", "partial"], doc
    assert "ran past --timeout 3 s" in doc["error"]["message"] and "--timeout" in doc["error"]["hint"], doc
    assert "error:" in cut.stderr and "ran past --timeout" in cut.stderr, cut.stderr
