"""`ddtreectl status local` through the INSTALLED console script, on this machine (no SSH)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def ddtreectl(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    if exe is None:
        pytest.skip("ddtreectl is not installed (python3 -m pip install -e .)")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_status_local_json_on_the_shipped_inventory() -> None:
    # Targets only `local`: nothing is sent to ct200 (it is not probed, only read from hosts.yaml).
    run = ddtreectl("status", "local", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["schema"] == "ddtreectl.status/1" and report["exit_code"] == 0
    assert report["summary"] == {"hosts": 1, "answered": 1, "unreachable": 0, "refused": 0,
                                 "timeout": 0, "failed": 0}
    (local,) = report["hosts"]
    assert (local["name"], local["transport"], local["outcome"]) == ("local", "local", "ok")
    assert local["identity"]["machine_id"] == Path("/etc/machine-id").read_text().strip()
    assert local["identity"]["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    if shutil.which("nvidia-smi") is None:
        assert local["gpus"]["status"] == "missing" and local["gpus"]["found"] == 0
    assert local["service"] is None  # the shipped `local` host runs no service profile
    assert local["release"]["root"] == os.path.expanduser("~/.local/share/ddtree")
    assert local["disk"]["total_bytes"] > 0


def test_status_local_table(tmp_path: Path) -> None:
    run = ddtreectl("status", "local", env={"COLUMNS": "200"})
    assert run.returncode == 0, run.stderr
    assert "local" in run.stdout and "1/1 hosts answered" in run.stdout


def test_local_host_with_a_service_but_no_systemd_and_no_release(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"""\
services:
  demo:
    template: sglang-ddtree.service.j2
    port: 30000
    model_path: /models/demo
    served_model_name: demo
hosts:
  here:
    transport: local
    address: 127.0.0.1
    gpus: 8
    service: demo
    remote_root: {tmp_path}/ddtree
""")
    run = ddtreectl("-i", str(inventory), "status", "--json")
    assert run.returncode == 0, run.stderr
    (here,) = json.loads(run.stdout)["hosts"]
    assert here["release"]["root_exists"] is False
    if os.path.exists("/run/systemd/system"):
        pytest.skip("systemd runs here: the unit is simply not installed")
    assert here["service"]["state"] == "unknown" and here["service"]["known"] is False
    assert here["service"]["words"].startswith("unknown: systemd is not running")
    if shutil.which("nvidia-smi") is None:
        assert "nvidia-smi missing (expected 8 GPUs)" in here["warnings"]


def test_unknown_target_is_an_inventory_error() -> None:
    run = ddtreectl("status", "nosuchhost", "--json")
    assert run.returncode == 3
    assert "'nosuchhost' is neither a host nor a group" in run.stderr
    doc = json.loads(run.stdout)  # --json: the error as the one document on stdout
    assert (doc["exit_code"], doc["hosts"], doc["error"]["exit_code"]) == (3, [], 3)
    assert "'nosuchhost' is neither a host nor a group" in doc["error"]["message"]


def test_completion_lists_hosts_and_groups_and_survives_a_broken_inventory(tmp_path: Path) -> None:
    env = {"_DDTREECTL_COMPLETE": "complete_bash", "COMP_WORDS": "ddtreectl status ", "COMP_CWORD": "2"}
    run = ddtreectl(env=env)
    assert run.returncode == 0
    assert set(run.stdout.split()) == {"all", "ct200", "local", "prod"}
    env_p = {**env, "COMP_WORDS": "ddtreectl status pr"}
    assert ddtreectl(env=env_p).stdout.split() == ["prod"]
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts: [\n")
    run = ddtreectl(env={**env, "DDTREECTL_INVENTORY": str(broken)})
    assert (run.returncode, run.stdout.strip(), run.stderr) == (0, "", "")
    other = tmp_path / "other.yaml"
    other.write_text("hosts:\n  alpha:\n    transport: local\n    address: 127.0.0.1\n")
    run = ddtreectl(env={**env, "COMP_WORDS": f"ddtreectl -i {other} status ", "COMP_CWORD": "4"})
    assert set(run.stdout.split()) == {"all", "alpha"}


def test_table_fits_80_columns_uncropped(tmp_path: Path) -> None:
    """80 columns: a default terminal, and Rich's width when stdout is a pipe. With a `local` host
    and one unreachable host the ruled table needed 85 and Rich cut its right edge off: the whole
    warnings column and the border. Now it falls back to a table without rules."""
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connects are refused (loopback only)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  gpu-node-01:\n    address: 127.0.0.1\n    port: {port}\n    gpus: 0\n"
                         f"  local:\n    transport: local\n    gpus: 0\n    remote_root: {tmp_path / 'root'}\n")
    run = ddtreectl("-i", str(inventory), "status", env={"COLUMNS": "80"})
    assert run.returncode == 6, run.stderr
    table = run.stdout.split("hosts answered")[0].splitlines()[:-1]
    assert all(len(line) <= 80 for line in table), "\n".join(table)
    # Too narrow for seven readable columns: one block per host (session 13), the unreachable one's
    # name, address and reach on one line, its reason pointed to.
    assert f"gpu-node-01  127.0.0.1:{port}  unreachable" in table and "  reason below" in table, "\n".join(table)
    assert any(line.startswith("  service   ") for line in table), "\n".join(table)
    run = ddtreectl("-i", str(inventory), "status", env={"COLUMNS": "160"})
    table = [line.replace("┃", " ").replace("│", " ") for line in run.stdout.split("hosts answered")[0].splitlines()]
    assert table[1].split() == ["host", "address", "reach", "GPUs", "service", "release", "warnings"]
    # the unreachable host's warnings cell, whole, in the last column
    assert [line.split()[-1] for line in table if "gpu-node-01" in line] == ["below"], "\n".join(table)


def test_release_ids_unit_names_and_paths_are_never_cut_at_80_columns(tmp_path: Path) -> None:
    """A 12-character release id and a unit name like `sglang-k26-ddtree` were cut to `c098494c62…`
    and `sglang-k26…` at 80 columns (Rich shrank the ruled table's columns below their longest word
    and ellipsized). Now the compact table is taken when the ruled one cannot show every word
    whole, and a word that fits neither is folded onto the next line, never cut."""
    release = "c098494c62d6"
    root = tmp_path / "ddtree"
    (root / "releases" / release).mkdir(parents=True)
    (root / "releases" / release / ".build-stamp").write_text(json.dumps(
        {"id": release, "selftest": "skipped: no GPU", "archs": "90", "by": "qa", "time": "t", "ninja_steps": 6}))
    (root / "current").symlink_to(f"releases/{release}")
    shutil.copytree(REPO / "templates", tmp_path / "templates")
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connects are refused (loopback only)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"""\
services:
  k26:
    template: sglang-ddtree.service.j2
    unit_name: sglang-k26-ddtree
    port: 30000
    model_path: /models/k26
    served_model_name: k26
hosts:
  gpu-node-01:
    address: 127.0.0.1
    port: {port}
    gpus: 0
  here:
    transport: local
    gpus: 0
    service: k26
    remote_root: {root}
""")
    run = ddtreectl("-i", str(inventory), "status", "here", env={"COLUMNS": "80"})
    assert run.returncode == 0, run.stderr
    table = run.stdout.split("hosts answered")[0].splitlines()[:-1]
    assert all(len(line) <= 80 for line in table), "\n".join(table)
    assert "…" not in run.stdout, run.stdout
    assert release in run.stdout and "sglang-k26-ddtree:" in run.stdout, run.stdout
    # too many long words for 80 columns: some fold, none is cut
    run = ddtreectl("-i", str(inventory), "status", env={"COLUMNS": "80"})
    assert run.returncode == 6, run.stderr
    assert "…" not in run.stdout, run.stdout


def test_reasons_below_the_table_are_one_line_each_in_a_pipe(tmp_path: Path) -> None:
    """Through a pipe (80 columns) the reason and hint of a host that did not answer were wrapped by
    Rich, splitting `host:port` or a command of the hint across lines of a log."""
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: connects are refused (loopback only)
    name = "gpu-node-with-a-long-name-in-rack-17-row-b"
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  {name}:\n    address: 127.0.0.1\n    port: {port}\n    gpus: 0\n")
    run = ddtreectl("-i", str(inventory), "status", env={"COLUMNS": "80"})
    assert run.returncode == 4, run.stderr  # its one host unreachable: 4, as every command says it
    below = run.stdout.split("hosts answered")[1].splitlines()[1:]
    assert below[0] == f"{name}: cannot reach 127.0.0.1:{port}: connection refused", below
    assert below[1] == "  hint: is sshd running on that port? check `port:` in the inventory", below


def test_a_host_silent_past_the_deadline_gets_the_option_status_has(tmp_path: Path) -> None:
    """A TCP listener that never speaks SSH: the connect hangs past --timeout. The hint named
    `--deadline` (status documents --timeout) and did not mention an address change."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever sends a banner
        port = silent.getsockname()[1]
        inventory = tmp_path / "hosts.yaml"
        inventory.write_text(f"hosts:\n  mute:\n    address: 127.0.0.1\n    port: {port}\n    connect_timeout: 30\n")
        run = ddtreectl("-i", str(inventory), "status", "mute", "--timeout", "2", "--no-reuse", "--json")
    assert run.returncode == 4, run.stderr  # no answer from the only host: 4 (connection), not 6
    (host,) = json.loads(run.stdout)["hosts"]
    assert host["outcome"] == "timeout" and "2 s deadline" in host["error"]["message"]
    assert host["error"]["hint"] == ("the host may be down, slow, or at a new address (`ddtreectl set-ip mute "
                                     "ADDRESS`); raise --timeout to wait longer")
