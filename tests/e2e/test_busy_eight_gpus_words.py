"""End-to-end: `mode HOST dev` and `gpus` on a real test host whose 8 GPUs stay busy (an nvidia-smi
stand-in with a serving SGLang's output), at 80 columns. `mode dev`'s refusal listed every reason of every GPU (process, memory, utilization,
invisible owner: 32 of them) in one error line of about 2,000 characters; now it says the first few and
how many more, with the command that lists them, while --json keeps every reason. `gpus` gave each row
the model's 44-character name, which left the processes column so narrow that commands were cut
("sglang::sched…"); one model is now named once above the table, each busy GPU is one row, and the
lines under the table say only what the rows do not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_status import nvidia_smi_stub
from tests.probes.fixtures import fixture

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]


def mode_dev(inventory: Path, host: str, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    return subprocess.run([exe, "-i", str(inventory), "mode", host, "dev", "--reason", "bench", "--idle-timeout", "1",
                           *extra], capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})


@pytest.fixture
def busy_eight(testbed: Any, boot_hosts: Any, tmp_path: Path) -> tuple[Any, Path]:
    serving = nvidia_smi_stub(fixture("nvidia-smi-gpus-rtxpro6000-8x-serving.txt"),
                              fixture("nvidia-smi-apps-rtxpro6000-8x-serving.txt"))
    (host,) = boot_hosts(["busy-eight"], gpus_stub={"busy-eight": serving})
    return host, testbed.inventory([host], tmp_path / "hosts.yaml", host_overrides={host.name: {"gpus": 8}})


@pytest.mark.testbed
def test_gpus_names_one_model_once_and_cuts_no_command(busy_eight: tuple[Any, Path]) -> None:
    host, inventory = busy_eight
    exe = shutil.which("ddtreectl")
    assert exe is not None
    run = subprocess.run([exe, "-i", str(inventory), "gpus", host.name, "--samples", "1"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "COLUMNS": "80"})
    assert run.returncode == 7, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert lines[1] == "  8 × NVIDIA RTX PRO 6000 Blackwell Server Edition", run.stdout
    assert run.stdout.count("Blackwell") == 1 and "…" not in run.stdout, run.stdout
    # Compact and said once: each busy GPU is one row (it took two, its process wrapped), and the lines
    # under the table no longer repeat every row's process, memory and utilization (32 lines).
    rows = [line for line in lines if line[:1].isdigit()]
    assert [row.split("│")[0].strip() for row in rows] == [str(i) for i in range(8)], run.stdout
    assert all(f"sglang::scheduler_TP{i}" in rows[i] and "87.1/95.6 GiB" in rows[i] for i in range(8)), run.stdout
    assert all(run.stdout.count(f"sglang::scheduler_TP{i}") == 1 for i in range(8)), run.stdout
    assert lines[-1] == "  GPUs 0-7: unknown: 1 process(es) not visible from the host's PID namespace", run.stdout
    assert len(lines) == 13 and max(len(line) for line in lines) <= 80, run.stdout

@pytest.mark.testbed
def test_busy_refusal_names_the_first_reasons_and_how_to_see_all(busy_eight: tuple[Any, Path]) -> None:
    host, inventory = busy_eight

    refused = mode_dev(inventory, host.name)
    assert refused.returncode == 7, refused.stdout + refused.stderr
    error = next(line for line in refused.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith("error: busy-eight: GPUs busy after ") and "GPU 0: pid " in error, error
    assert "GPU 7" not in error and f"more (`ddtreectl gpus {host.name}` lists them)" in error, error
    assert len(error) < 500, error

    doc = json.loads(mode_dev(inventory, host.name, "--json").stdout)
    reasons = doc["gpus"]["reasons"]
    assert len(reasons) > 8 and any(r.startswith("GPU 7: ") for r in reasons), reasons  # --json keeps them all
    more = len(reasons) - 4
    assert f"; and {more} more (`ddtreectl gpus {host.name}` lists them)" in doc["error"]["message"], doc["error"]
