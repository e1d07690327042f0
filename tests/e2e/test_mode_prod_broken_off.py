"""End-to-end: `ddtreectl mode HOST prod` broken off by Ctrl-C, on a real systemd + sshd test host with the
engine's reference server as the service, through the INSTALLED CLI.

Found by session 10: interrupted after its `systemctl enable`, the switch left the unit ENABLED while the
development lease still held the host (a reboot would start production on the holder's GPUs). Now the unit's
real state settles it, and the message says which way:
- broken off before the start took: rolled back (the enable undone, the lease kept);
- broken off once the unit was started (during the health gate): finished (the lease ends, as after a
  failed gate), saying its health was not verified.

On the way, `run` interrupted by Ctrl-C stops its command on the host too.

The host declares no GPUs (`gpus: 0`) and has no nvidia-smi: `mode HOST dev` takes it without one (it used
to refuse: "GPUs can never be verified idle"). A `systemctl` stand-in first on the host's PATH holds the
switch between its enable and its start (it sleeps on `reset-failed`, the command just before the start)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_mode import SERVICES, UNIT, audit, ddtreectl, lay_out_release, lease
from tests.e2e.host_setup import install_service_units

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
REACHED = "/run/ddt-start-reached"
HOLD_START = f"""#!/bin/sh
case " $* " in *" reset-failed "*) touch {REACHED}; sleep 600 ;; esac
exec /usr/bin/systemctl "$@"
"""


def unit_state(host: Any) -> tuple[str, str]:
    return (host.systemctl("is-active", UNIT, check=False).stdout.strip(),
            host.systemctl("is-enabled", UNIT, check=False).stdout.strip())


def interrupt_prod(inventory: Path, ready: Any, *args: str) -> tuple[int, str, str]:
    """`mode HOST prod ARGS`, Ctrl-C once `ready()` says so; (exit status, stdout, stderr)."""
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    proc = subprocess.Popen([exe, "-i", str(inventory), "mode", "mb-host", "prod", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "USER": "alice", "LOGNAME": "alice"})
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None, f"mode prod ended early ({proc.returncode}): {proc.communicate()}"
            assert time.monotonic() < deadline, "the switch never got there"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, out, err


def test_mode_prod_broken_off_is_rolled_back_or_finished_and_says_which(
        testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["mb-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={"mb-host": {"service": "ref", "role": "prod", "gpus": 0}})
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    lay_out_release(host)
    install_service_units(inventory, host.name)
    i = str(inventory)
    assert host.sh("command -v nvidia-smi", check=False).returncode != 0
    dev = ddtreectl("-i", i, "mode", "mb-host", "dev", "--reason", "cpu work")  # gpus: 0, no nvidia-smi
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert lease(host)["mode"] == "dev" and unit_state(host) == ("inactive", "disabled")

    # `run` interrupted: the command stops on the host too (it used to run on until it ended or --timeout).
    exe = shutil.which("ddtreectl")
    assert exe is not None
    job = subprocess.Popen([exe, "-i", i, "run", "mb-host", "--", "sh", "-c", "sleep 4321 & wait"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env={**os.environ, "USER": "alice", "LOGNAME": "alice"})
    deadline = time.monotonic() + 60
    while host.sh("pgrep -x sleep", check=False).returncode != 0:
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGINT)
    assert job.wait(timeout=60) == 130
    job.communicate()
    assert host.sh("pgrep -x sleep", check=False).returncode != 0, "the interrupted command runs on"

    # 1. Broken off between the enable and the start: rolled back.
    host.write_file("/usr/local/bin/systemctl", HOLD_START, mode=0o755)
    code, out, err = interrupt_prod(inventory, lambda: (host.root / REACHED.lstrip("/")).exists())
    assert code == 130, out + err
    assert "interrupted: nothing was started" in err and "so the switch was rolled back: " \
           f"{UNIT} disabled again; the host stays in development mode (the development lease of alice@" in err, err
    assert "hint: `ddtreectl mode mb-host prod` again when you are ready" in err, err
    assert unit_state(host) == ("inactive", "disabled")  # it was left enabled
    assert lease(host)["mode"] == "dev" and lease(host)["holder"].startswith("alice@")
    assert host.sh("pgrep -x sleep", check=False).returncode != 0  # the held command was stopped too
    assert not (host.root / "opt/ddtree/state/locks/mode.lock").exists()
    last = audit(host)[-1]
    assert (last["action"], last["to"], last["ok"], last["interrupted"], last["broken_off"]) == \
        ("mode", "prod", False, True, "rolled back"), last

    # 2. Broken off once the unit was started (its health gate running): finished; --json says so too.
    host.sh(f"rm -f /usr/local/bin/systemctl {REACHED}")
    code, out, err = interrupt_prod(
        inventory, lambda: host.systemctl("is-active", UNIT, check=False).stdout.strip() in ("active", "activating"),
        "--json")
    assert code == 130, out + err
    doc = json.loads(out)
    assert (doc["exit_code"], doc["broken_off"], doc["lease"]["mode"], doc["lease_kept"]) == \
        (130, "finished", "prod", False), doc
    err = doc["error"]["message"] + "\nhint: " + doc["error"]["hint"]
    assert f"interrupted: {UNIT} had been started" in err and "so the switch was finished: the host is in " \
           "production mode now (the development lease has ended); its health was NOT verified" in err, err
    assert "hint: `ddtreectl restore-service mb-host` verifies it" in err, err
    assert unit_state(host)[1] == "enabled" and lease(host)["mode"] == "prod"
    assert audit(host)[-1]["broken_off"] == "finished"
    run = ddtreectl("-i", i, "run", "mb-host", "--", "true")
    assert run.returncode == 7, run.stderr  # production's now: development work is refused
