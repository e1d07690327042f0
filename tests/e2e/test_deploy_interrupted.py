"""End-to-end: Ctrl-C / SIGTERM during `ddtreectl deploy` while the build runs on a real systemd + sshd test
host, through the INSTALLED CLI.

Found by session 10: the interrupted deploy exited 130, but its remote build ran on until its timeout (an
hour) — compiling on the host, holding the build workspace lock the next deploy then waited on — and the
message said only "hosts keep serving their old release". Now the build is stopped on the host (its process
group killed over the same SSH connection) and the message says, per host, where it stopped, that the build
was stopped, which release is `current` (nothing was switched) and that the lock was released.

The engine is a stand-in whose build is one ninja step: quick, or, while a `slow` file is in the sources, a
`sleep` standing for a long compile (no compiler needed)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SLEEP = "sleep 4321"  # the "compile" the interrupt must stop, recognisable in the host's process list
CMAKE = """cmake_minimum_required(VERSION 3.16)
project(standin NONE)
add_custom_target(compile ALL COMMAND sh ${CMAKE_SOURCE_DIR}/compile.sh)
"""
COMPILE = f'[ ! -e "$(dirname "$0")/slow" ] || exec {SLEEP}\n'



def remote_sleeps(host: Any) -> list[str]:
    return [line for line in host.sh("ps -eo pid=,args=", check=False).stdout.splitlines()
            if line.split(None, 1)[-1] == SLEEP]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_deploy_stops_the_remote_build_and_says_what_is_current(
        testbed: Any, boot_hosts: Any, tmp_path: Path, sig: signal.Signals) -> None:
    (host,) = boot_hosts([f"di-{sig.name.lower()[3:]}"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml")
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine/CMakeLists.txt").write_text(CMAKE)
    (tmp_path / "engine/compile.sh").write_text(COMPILE)
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    first = subprocess.run([exe, "-i", str(inventory), "deploy", "--host", host.name], capture_output=True,
                           text=True, timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    r1 = os.readlink(host.root / "opt/ddtree/current").rsplit("/", 1)[-1]

    (tmp_path / "engine/slow").write_text("a long compile\n")  # a new release, whose build takes long
    proc = subprocess.Popen([exe, "-i", str(inventory), "deploy", "--host", host.name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not remote_sleeps(host):
            assert proc.poll() is None, f"deploy ended early ({proc.returncode}): {proc.communicate()}"
            assert time.monotonic() < deadline, "the build never started"
            time.sleep(0.1)
        t0 = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)  # a terminal's Ctrl-C: the whole foreground group
        else:
            proc.send_signal(sig)  # a supervisor's stop: ddtreectl alone
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()

    assert proc.returncode == 130, (out, err)
    assert f"{host.name}: interrupted during the build (it was stopped on the host); nothing was switched: " \
           f"`current` is still {r1}" in err, err
    assert "was not activated (its staged copy .incoming-" in err and "the deploy lock was released" in err, err
    assert "hint:" not in err, err  # every host answered: no lock to go looking for
    assert took < 30, f"the interrupt took {took:.1f} s"
    # The host is in exactly that state: no build left running, both locks free, `current` unchanged.
    assert remote_sleeps(host) == []
    assert host.sh("flock -n /opt/ddtree/build/.lock true", check=False).returncode == 0
    assert not (host.root / "opt/ddtree/state/locks/deploy.lock").exists()
    assert os.readlink(host.root / "opt/ddtree/current").rsplit("/", 1)[-1] == r1
