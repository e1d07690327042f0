"""A `transport: local` host for CLI tests that run the INSTALLED console script: an inventory with one host
`box`, a deploy root holding release r1 as `current`, and an `nvidia-smi` stand-in on PATH that prints a
fixture from tests/probes/fixtures (so the GPU verdict is whatever that capture says)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.probes.fixtures import fixture


def make_local_box(tmp_path: Path, gpus_fixture: str) -> tuple[Path, Path, dict[str, str]]:
    """(inventory, deploy root, environment for the CLI) of a one-GPU local host whose nvidia-smi prints
    `gpus_fixture` for every --query-gpu."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "gpus.txt").write_text(fixture(gpus_fixture))
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.write_text(f"#!/bin/sh\ncase \"$1\" in --query-gpu=*) cat {tmp_path}/gpus.txt ;; esac\n")
    stub.chmod(0o755)
    root = tmp_path / "root"
    (root / "releases" / "r1").mkdir(parents=True)
    (root / "current").symlink_to("releases/r1")
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box:\n    transport: local\n    address: 127.0.0.1\n    gpus: 1\n"
                         f"    remote_root: {root}\n")
    return inventory, root, {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}", "USER": "carol"}


def installed_ddtreectl() -> str:
    """Path of the installed console script; skips the test when it is not installed."""
    exe = shutil.which("ddtreectl")
    if exe is None:
        pytest.skip("ddtreectl is not installed (python3 -m pip install -e .)")
    return exe


def ddtreectl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([installed_ddtreectl(), *args], capture_output=True, text=True, timeout=120, env=env)


def make_gpuless_box(tmp_path: Path) -> tuple[Path, Path]:
    """(inventory, deploy root) of a `transport: local` host `box` with no GPUs and nothing deployed yet, for
    tests that call the CLI in-process."""
    root = tmp_path / "root"
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box:\n    transport: local\n    gpus: 0\n    remote_root: {root}\n")
    return inventory, root
