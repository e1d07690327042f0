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


def deployed_and_running(testbed: Any, host: Any, tmp_path: Path, services: dict[str, Any], service: str,
                         old: str, unit: str) -> tuple[Path, str]:
    """A `role: prod` host running `unit` on the built release `old`, with a newer built release that a
    deploy from the stand-in workspace in `tmp_path` only activates; returns (inventory, new release)."""
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=services,
                                  host_overrides={host.name: {"service": service, "role": "prod"}})
    new = stand_in_workspace(tmp_path)
    lay_out_built(host, old)
    lay_out_built(host, new)
    host.sh(f"ln -sfn releases/{old} /opt/ddtree/current")
    install_service_units(inventory, host.name)
    host.systemctl("start", unit)
    return inventory, new


def reference_service(unit_name: str, served_model_name: str, *,
                      pythonpath: str = str(REPO / "engine/python"), load_delay_s: float = 0) -> dict[str, Any]:
    """A service profile that runs the engine's reference server (seeded random weights, CPU): a real
    HTTP server that passes restore-service's gate, which `deploy --restart` and `rollback --restart`
    run too (a `/bin/sleep infinity` unit never opens its port). By default it runs this checkout's
    engine/python, which the hosts see through their overlay root, for releases laid out without a
    Python package; `pythonpath="/opt/ddtree/current/python"` runs the deployed release's. `load_delay_s`
    keeps it loading that long after its port opens (/health answers 503 meanwhile)."""
    import sys

    return {"template": "sglang-ddtree.service.j2", "python": sys.executable, "module": "ddtree_engine.serve",
            "unit_name": unit_name, "port": 30000, "model_path": f"/models/{served_model_name}",
            "extra_args": ["--allow-random-weights", *(["--load-delay", str(load_delay_s)] if load_delay_s else [])],
            "served_model_name": served_model_name, "tp_size": 1,
            "environment": {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"},
            "health": {"unit_active_timeout": 30, "port_open_timeout": 120, "liveness_timeout": 60,
                       "readiness_timeout": 120, "total_timeout": 300}}


def installed_current(testbed: Any, host: Any, tmp_path: Path, services: dict[str, Any], service: str) -> Path:
    """A `role: prod` host whose current release (the stand-in workspace's in `tmp_path`) is laid out as
    built, with the service's units installed but not started; returns the inventory."""
    inventory = testbed.inventory([host], tmp_path / "hosts.yaml", services=services,
                                  host_overrides={host.name: {"service": service, "role": "prod"}})
    release = stand_in_workspace(tmp_path)
    lay_out_built(host, release)
    host.sh(f"ln -sfn releases/{release} /opt/ddtree/current")
    install_service_units(inventory, host.name)
    return Path(inventory)


def ctrl_c_during_gate(argv: list[str], host: Any, unit: str) -> tuple[int, str, str, float]:
    """Run the installed CLI with `argv`, wait until `unit` has a new main process and its health gate
    polls (the service loads far longer than the test), then Ctrl-C the whole foreground group as a
    terminal does; returns (exit code, stdout, stderr, seconds from the Ctrl-C to the exit)."""
    import os
    import signal
    import subprocess
    import time

    def main_pid() -> str:
        return str(host.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip())

    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    before = main_pid()
    proc = subprocess.Popen([exe, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while main_pid() in (before, "0") and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    time.sleep(3)  # the gate is polling now
    interrupted = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, time.monotonic() - interrupted
