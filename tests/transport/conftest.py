"""Fixtures of the transport tests: `start_sshd` (a throwaway real sshd, see sshd.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.transport.sshd import SSHD, LocalSshd, launch_sshd


@pytest.fixture
def start_sshd(tmp_path: Path) -> Iterator[Callable[..., LocalSshd]]:
    """`start_sshd(clean_rc=True, key_type="ed25519", extra_keys=())` -> a running LocalSshd."""
    if not os.path.exists(SSHD) or os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root, /usr/sbin/sshd and unshare (scripts/test installs openssh-server)")
    started: list[subprocess.Popen[bytes]] = []

    def start(**kw: object) -> LocalSshd:
        proc, sshd = launch_sshd(tmp_path / f"sshd{len(started)}", **kw)  # type: ignore[arg-type]
        started.append(proc)
        return sshd

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()  # by PID: the sshd listener we started (sessions end with their channel)
        proc.wait()
