"""`gpus`'s table at 80 columns, rendered from nvidia-smi captures: a busy GPU is one row (pid, owner,
command), and the lines under the table keep only what no row shows (the service unit, what could not be
read, said once for every GPU it concerns). It printed each process twice: wrapped over two lines in
the table, then again among four reason lines per busy GPU."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from ddtreectl.operations.gpus import GpuCheck
from ddtreectl.probes.gpu_holders import GpuHolder
from ddtreectl.probes.gpu_verdict import gpu_verdict
from ddtreectl.ui import console, gpus_view

from tests.probes.test_gpu_verdict import UNIT, samples_of


def shown(check: GpuCheck, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out = Console(file=io.StringIO(), width=80, force_terminal=False, color_system=None)
    monkeypatch.setattr(console, "stdout", lambda: out)
    gpus_view.show_check(check)
    return out.file.getvalue().splitlines()  # type: ignore[attr-defined]


def test_busy_h200_is_one_row_and_the_unit_line_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    torch_proc = GpuHolder(1788, "root", "0::/", "python3 -c import torch", True)
    phase = "busy-torch"
    s = samples_of([f"nvidia-smi-gpus-h200-captured-{phase}.txt"] * 2,
                   [f"nvidia-smi-apps-h200-captured-{phase}.txt"] * 2, holders=(torch_proc,), serving="active")
    v = gpu_verdict(s, unit=UNIT, expected_gpus=1)
    lines = shown(GpuCheck("h200", v), monkeypatch)
    (row,) = [line for line in lines if line.startswith("0 ")]
    assert "1788 (root) python3 -c import torch" in row and " GiB │ " in row, lines
    assert lines[-1] == f"  {UNIT} is active", lines  # host-level: kept
    assert sum("1788" in line for line in lines) == 1 and "utilization 99" not in "\n".join(lines), lines
    assert max(len(line) for line in lines) <= 80, lines


def test_eight_busy_gpus_fit_80_columns_once_each(monkeypatch: pytest.MonkeyPatch) -> None:
    s = samples_of(["nvidia-smi-gpus-rtxpro6000-8x-serving.txt"], ["nvidia-smi-apps-rtxpro6000-8x-serving.txt"])
    lines = shown(GpuCheck("busy-eight", gpu_verdict(s, unit=None, expected_gpus=8)), monkeypatch)
    rows = [line for line in lines if line[:1].isdigit()]
    assert len(rows) == 8 and all(f"{41873 + i} (?) sglang::scheduler_TP{i}" in rows[i] for i in range(8)), lines
    assert lines[-1] == "  GPUs 0-7: unknown: 1 process(es) not visible from the host's PID namespace", lines
    assert len(lines) == 13 and max(len(line) for line in lines) <= 80, lines


@pytest.mark.parametrize(("labels", "said"), [(["3"], "GPU 3"), (["0", "1", "2", "3"], "GPUs 0-3"),
                                              (["0", "1", "5"], "GPUs 0, 1, 5"), (["0", "2", "3", "4", "7"],
                                                                                  "GPUs 0, 2-4, 7")])
def test_gpu_lists_collapse_runs(labels: list[str], said: str) -> None:
    assert gpus_view._gpu_list(labels) == said
