"""Setting a test host up the way a deploy leaves it, without a compiler: shared by the e2e tests
that start from "a release is built and the units are installed"."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from ddtreectl.inventory.loader import load
from ddtreectl.operations.release import release_id, walk_files
from ddtreectl.operations.units import install_units
from ddtreectl.render.units import render_service
from ddtreectl.transport import connect

REPO = Path(__file__).resolve().parents[2]


def lay_out_built(host: Any, release: str) -> None:
    """`releases/<release>` with the stamp of a built release whose self-test was skipped (no GPU)."""
    target = host.root / "opt/ddtree/releases" / release
    target.mkdir(parents=True)
    (target / ".build-stamp").write_text(json.dumps({"id": release, "selftest": "skipped: no GPU"}) + "\n")


def stand_in_workspace(workspace: Path) -> str:
    """The real templates and a one-file stand-in engine under `workspace`; returns the release id a
    deploy computes for them (no GPU, no build settings), so a release laid out under that id is one
    deploy only activates."""
    shutil.copytree(REPO / "templates", workspace / "templates")
    (workspace / "engine").mkdir()
    (workspace / "engine/CMakeLists.txt").write_text("# a stand-in engine: its release is laid out as built\n")
    files = walk_files(workspace / "engine") + walk_files(workspace / "templates", "templates/")
    return release_id(files, {"cuda_archs": "", "cmake_args": []})


def install_service_units(inventory: Path, host_name: str) -> None:
    """Render the host's service unit from the inventory and install it on the host, as deploy does."""
    inv = load(inventory)
    rendered = render_service(inv, inv.host(host_name))
    assert rendered is not None
    with connect(inv.host(host_name), inv) as transport:
        install_units(transport, rendered)
