"""End-to-end: `deploy --plan` against a real systemd + sshd test host that has no release yet, where
every file of the engine tree is a change (hundreds for the real engine).

The plan used to print 40 paths per kind and "... N more", a screen of paths in which the build, lock
and GPU lines were lost. Now a long list is summarized: the counts, the counts per top directory, the
first few paths and how to see them all (`--all-files`, or `--json`, which always has every path).
A short list (what a one-file change gives) is still printed whole.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import stand_in_workspace

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

SERVICES = {"ps": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/ps",
                   "served_model_name": "ps", "unit_name": "ddtree-ps", "exec_start": "/bin/sleep infinity"}}


def plan(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), "deploy", "--host", "ps-host", "--plan", *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})


@pytest.mark.testbed
def test_a_long_file_list_is_summarized(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    (host,) = boot_hosts(["ps-host"])
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=SERVICES,
                                  host_overrides={host.name: {"service": "ps"}})
    stand_in_workspace(tmp_path)
    for i in range(120):
        (tmp_path / "engine/src").mkdir(exist_ok=True)
        (tmp_path / "engine/src" / f"k{i:03d}.cu").write_text(f"// {i}\n")
    for i in range(60):
        (tmp_path / "engine/include/ddtree").mkdir(parents=True, exist_ok=True)
        (tmp_path / "engine/include/ddtree" / f"h{i:03d}.h").write_text(f"// {i}\n")
    for i in range(9):  # more top directories than the summary names: it runs past 80 columns
        (tmp_path / f"engine/third-party-kernels-{i}").mkdir()
        (tmp_path / f"engine/third-party-kernels-{i}/k.cu").write_text(f"// {i}\n")
    shipped = 120 + 60 + 9 + 1 + len(list((tmp_path / "templates").iterdir()))

    short = plan(inventory)
    assert short.returncode == 0, short.stdout + short.stderr
    out = short.stdout
    assert f"files: {shipped} added, 0 changed, 0 deleted" in out, out
    assert "added by directory: src/ 120, include/ 60," in out, out
    # ... kept within the 80 columns, the lines after the first wrapped under its first count
    summary = out[out.index("    added by directory: "):out.index("    + CMakeLists.txt")].splitlines()
    assert len(summary) > 1 and all(line.startswith(" " * 24) for line in summary[1:]), out
    assert "more directories" in summary[-1] and "third-party-kernels-0/ 1" in out, out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "+ CMakeLists.txt" in out and "+ include/ddtree/h000.h" in out, out  # the first few, sorted
    assert "+ src/k119.cu" not in out, out
    assert f"+ ... {shipped - 5} more (`--all-files` lists every path)" in out, out
    assert len(out.splitlines()) < 25, out  # the build, lock and GPU lines stay on one screen
    assert "lock: free" in out and "GPUs:" in out, out

    full = plan(inventory, "--all-files")
    assert full.returncode == 0, full.stdout + full.stderr
    assert "+ src/k119.cu" in full.stdout and "more" not in full.stdout, full.stdout
    assert len([line for line in full.stdout.splitlines() if line.lstrip().startswith("+ ")]) == shipped

    doc = json.loads(plan(inventory, "--json").stdout)
    assert len(doc["hosts"][0]["files"]["added"]) == shipped  # --json: every path, as before

    refused = subprocess.run([shutil.which("ddtreectl") or "ddtreectl", "-i", str(inventory), "deploy", "--host",
                              "ps-host", "--all-files"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--all-files" in refused.stderr and "--plan" in refused.stderr, refused.stderr
