"""A ddtreectl stopped by a signal other than Ctrl-C (SIGTERM from `timeout`, a CI job being cancelled,
`systemctl stop`; SIGHUP when the operator's SSH session drops) must clean up like Ctrl-C does: release
the host lock it holds and exit 130. Python's default for SIGTERM/SIGHUP ends the process without
running `finally:`, which left the `mode` lock held for the lock's whole TTL (17 min by default) and
made the next `ddtreectl mode` refuse with exit 8, "another mode switch is in progress".

Driven through the INSTALLED console script on a `transport: local` host whose GPU stays busy, so
`mode HOST dev` sits in "verifying the GPUs went idle" with the lock held when the signal arrives."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli.local_box import installed_ddtreectl, make_local_box


@pytest.fixture
def busy_box(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    # 1 H200 with memory in use and no process listed: busy (memory) on every sample, forever.
    return make_local_box(tmp_path, "nvidia-smi-gpus-h200-1x-memory-no-process.txt")


def signal_mode_switch(inventory: Path, env: dict[str, str], lock_dir: Path, signum: signal.Signals,
                       *extra: str) -> tuple[int, str, str]:
    """Start `mode box dev`, wait until it holds the mode lock and sits in the idle wait (the GPU never goes
    idle), send `signum`; the exit status, stdout and stderr."""
    proc = subprocess.Popen([installed_ddtreectl(), "-i", str(inventory), "mode", "box", "dev", "--reason", "profile",
                             "--idle-timeout", "300", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not lock_dir.exists():
            assert proc.poll() is None, f"mode exited early ({proc.returncode}): {proc.communicate()}"
            assert time.monotonic() < deadline, "mode never took its lock"
            time.sleep(0.05)
        time.sleep(0.5)  # into the idle wait
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_signal_during_mode_switch_releases_the_lock(busy_box: tuple[Path, Path, dict[str, str]],
                                                     signum: signal.Signals) -> None:
    inventory, root, env = busy_box
    lock_dir = root / "state" / "locks" / "mode.lock"
    returncode, _, err = signal_mode_switch(inventory, env, lock_dir, signum)
    assert returncode == 130, err
    assert "Traceback" not in err
    assert not lock_dir.exists(), "the mode lock outlived the command"
    # and the next switch is not told that another one is in progress
    again = subprocess.run([installed_ddtreectl(), "-i", str(inventory), "lock", "status", "box", "--name", "mode"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 0 and "free" in again.stdout, again.stdout + again.stderr


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_ctrl_c_says_interrupted_and_json_still_prints_its_document(
        busy_box: tuple[Path, Path, dict[str, str]], json_out: bool) -> None:
    """Typer turns KeyboardInterrupt into a silent Exit(130): Ctrl-C ended every command but deploy
    without a word, and `--json` without the one document README promises on failure."""
    inventory, root, env = busy_box
    lock_dir = root / "state" / "locks" / "mode.lock"
    returncode, out, err = signal_mode_switch(inventory, env, lock_dir, signal.SIGINT,
                                              *(["--json"] if json_out else []))
    assert returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    if json_out:
        doc = json.loads(out)
        assert (doc["schema"], doc["exit_code"], doc["ok"], doc["host"]) == ("ddtreectl.mode/1", 130, False, "box")
        assert doc["error"]["message"].startswith("interrupted") and doc["error"]["exit_code"] == 130, doc
    else:
        assert out == "", out
    assert not lock_dir.exists(), "the mode lock outlived the command"
