"""Deploy's live progress lines on a terminal (Rich, on stderr) at 80 and 100 columns.

README promises rsync's percent and ninja's `[n/m]` on each host's line; the bar showed them only
as a bar, and with a long ninja step the detail squeezed the bar and cut the elapsed time
("0:01:…")."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from ddtreectl.operations.deploy import DeployEvent
from ddtreectl.ui import console, deploy_view

STEP = "Building CUDA object CMakeFiles/ddtree.dir/src/draft_topk_lse.cu.o"


def lines_after(events: list[DeployEvent], width: int, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The progress lines as the terminal shows them once the last event is in."""
    term = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    monkeypatch.setattr(console, "stderr", lambda: term)
    with deploy_view.DeployProgress(["gpu-node-01", "gpu-node-02"]) as progress:
        for e in events:
            progress.event(e)
    raw = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", term.file.getvalue())  # type: ignore[attr-defined]
    shown = [line for line in raw.replace("\r", "\n").split("\n") if line.startswith("gpu-node-0")]
    return shown[-2:]  # the final frame: one line per host


@pytest.mark.parametrize("width", [80, 100])
def test_lines_show_percent_steps_and_the_whole_elapsed_time(width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = lines_after([DeployEvent("gpu-node-01", "sync", 37, 100, "1,206,183 bytes"),
                            DeployEvent("gpu-node-02", "build", 3, 6, STEP)], width, monkeypatch)
    assert "37% 1,206,183 bytes" in one, one
    assert "[3/6] draft_topk_lse.cu.o" in two, two
    for line in (one, two):
        assert len(line.rstrip()) <= width, line
        assert "0:00:0" in line and "…" not in line.split("0:00:0")[0], line


def test_detail_words() -> None:
    assert deploy_view.progress_detail(DeployEvent("h", "build", 6, 6, "Linking CUDA shared library libddtree.so")) \
        == "[6/6] linking libddtree.so"
    assert deploy_view.progress_detail(DeployEvent("h", "build", 0, None, "archs 90")) == "archs 90"
    assert deploy_view.progress_detail(DeployEvent("h", "sync", 0, 100)) == "0%"


def test_the_summary_names_the_archs_once() -> None:
    """A build with no archs chosen read "archs engine default (engine default)"."""
    from ddtreectl.operations.deploy import DeployResult

    line = deploy_view.describe(DeployResult(host="h", release="r1", action="deployed", built=True, ninja_steps=4,
                                             archs="", archs_source="engine default"))
    assert "4 ninja steps, archs: the engine's default ·" in line and "(engine default)" not in line, line
    line = deploy_view.describe(DeployResult(host="h", release="r1", action="deployed", built=True, ninja_steps=4,
                                             archs="90;120", archs_source="inventory"))
    assert "4 ninja steps, archs 90;120 (inventory) ·" in line, line


def test_plain_lines_show_each_step_of_the_restart_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a terminal (CI, a log file): one line per phase change, and one per step of --restart's health
    gate, which can take many minutes (only "verify unit active" was printed, then nothing until done)."""
    out = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None)
    monkeypatch.setattr(console, "stderr", lambda: out)
    with deploy_view.DeployProgress(["h"]) as progress:
        for e in [DeployEvent("h", "switch"), DeployEvent("h", "restart"),
                  DeployEvent("h", "verify", detail="unit active"),
                  DeployEvent("h", "verify", detail="unit active: active (running)"),
                  DeployEvent("h", "verify", detail="liveness"), DeployEvent("h", "done", detail="activated")]:
            progress.event(e)
    assert out.file.getvalue().splitlines() == [  # type: ignore[attr-defined]
        "h: switch: pointing `current` at the new release", "h: restart: restarting the service, then its health gate",
        "h: verify unit active", "h: verify unit active: active (running)",
        "h: verify liveness", "h: done activated"]


def test_each_step_says_what_it_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """"h: lock", "h: probe", "h: units", "h: switch" said only the step's name: each now says in a few
    words what the host is doing, on one line, in a log (plain) as on a terminal (after the bar)."""
    out = Console(file=io.StringIO(), width=80, force_terminal=False, color_system=None)
    monkeypatch.setattr(console, "stderr", lambda: out)
    steps = ["lock", "probe", "sync", "selftest", "units", "switch"]
    with deploy_view.DeployProgress(["h"]) as progress:
        for step in steps:
            progress.event(DeployEvent("h", step))
    lines = out.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines == [
        "h: lock: taking the host's deploy lock", "h: probe: reading the host's releases, GPUs and units",
        "h: sync: copying the engine tree to the host (rsync)", "h: selftest: running the engine self-test on the host",
        "h: units: rendering the service units, installing what changed",
        "h: switch: pointing `current` at the new release"], lines
    assert all(len(line) <= 80 for line in lines)
    one, _ = lines_after([DeployEvent("gpu-node-01", "units")], 100, monkeypatch)
    assert "rendering the service units" in one, one
