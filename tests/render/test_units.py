"""Unit and config rendering: checked-in expected files, systemd's own verifier, strict variables."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ddtreectl.errors import TemplateError
from ddtreectl.inventory.models import Host, Inventory, ServiceProfile
from ddtreectl.render.quoting import exec_line, systemd_quote
from ddtreectl.render.units import render_service

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
EXPECTED = Path(__file__).parent / "expected"
PYTHON = "/usr/bin/python3"  # must exist where systemd-analyze runs (it checks ExecStart's binary)


def _single() -> tuple[Inventory, Host]:
    svc = ServiceProfile(
        name="sglang-k26-ddtree",
        template="sglang-ddtree.service.j2",
        python=PYTHON,
        port=30000,
        model_path="/models/Kimi-K2.6",
        served_model_name="kimi-k2.6",
        tp_size=8,
        extra_args=("--trust-remote-code", "--enable-metrics"),
        environment={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NCCL_DEBUG": "WARN"},
        speculative={"algorithm": "DDTREE", "draft_model_path": "/models/Kimi-K2.6-DFlash", "ddtree_budget": 64},
    )
    host = Host(name="ct200", address="10.1.230.171", gpus=8, role="prod", service=svc.name)
    return Inventory(path=REPO / "hosts.yaml", hosts={host.name: host}, groups={}, services={svc.name: svc}), host


def _two_node() -> Inventory:
    svc = ServiceProfile(
        name="k26-2node",
        template="sglang-ddtree.service.j2",
        python=PYTHON,
        port=30000,
        model_path="/models/Kimi-K2.6",
        served_model_name="kimi-k2.6",
        tp_size=16,
        nodes=("node-a", "node-b"),
        dist_init_port=5757,
        nccl_interface="eth1",
        environment={"NCCL_IB_DISABLE": "1"},
    )
    hosts = {
        "node-a": Host(name="node-a", address="10.9.0.11", gpus=8, role="prod", service=svc.name),
        "node-b": Host(name="node-b", address="10.9.0.12", gpus=8, role="prod", service=svc.name),
    }
    return Inventory(path=REPO / "hosts.yaml", hosts=hosts, groups={}, services={svc.name: svc})


def _cases() -> dict[str, tuple[Inventory, Host]]:
    inv, host = _single()
    two = _two_node()
    return {
        "single": (inv, host),
        "2node-rank0": (two, two.hosts["node-a"]),
        "2node-rank1": (two, two.hosts["node-b"]),
    }


@pytest.mark.parametrize("case", sorted(_cases()))
def test_rendered_files_match_checked_in_expectations(case: str) -> None:
    inventory, host = _cases()[case]
    rendered = render_service(inventory, host, TEMPLATES)
    assert rendered is not None
    for rendered_file in rendered.files:
        suffix = ".service" if rendered_file.path.endswith(".service") else ".yaml"
        expected = (EXPECTED / f"{case}{suffix}").read_text()
        assert rendered_file.content == expected, f"{case}{suffix} differs from the checked-in expectation"


def test_multi_node_arguments_point_every_rank_at_rank0() -> None:
    inventory = _two_node()
    for rank, name in enumerate(["node-a", "node-b"]):
        rendered = render_service(inventory, inventory.hosts[name], TEMPLATES)
        assert rendered is not None
        assert rendered.server_args["node-rank"] == rank
        assert rendered.server_args["nnodes"] == 2
        assert rendered.server_args["dist-init-addr"] == "10.9.0.11:5757"
        assert "Environment=NCCL_SOCKET_IFNAME=eth1" in rendered.unit_file.content


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("case", sorted(_cases()))
def test_rendered_units_pass_systemd_analyze_verify_with_empty_stderr(case: str, tmp_path: Path) -> None:
    inventory, host = _cases()[case]
    rendered = render_service(inventory, host, TEMPLATES)
    assert rendered is not None
    unit = tmp_path / rendered.unit
    unit.write_text(rendered.unit_file.content)
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_missing_variable_names_itself_and_the_host(tmp_path: Path) -> None:
    (tmp_path / "broken.service.j2").write_text("[Service]\nExecStart={{ exec_start }} {{ gpu_layout }}\n")
    inventory, host = _single()
    svc = inventory.services["sglang-k26-ddtree"]
    broken = Inventory(
        path=inventory.path,
        hosts=inventory.hosts,
        groups={},
        services={svc.name: ServiceProfile(**{**svc.__dict__, "template": "broken.service.j2"})},
    )
    with pytest.raises(TemplateError) as err:
        render_service(broken, host, tmp_path)
    assert "gpu_layout" in str(err.value)
    assert "ct200" in str(err.value)


def test_systemd_quoting_keeps_arguments_intact() -> None:
    assert systemd_quote("--port") == "--port"
    assert systemd_quote("a b") == '"a b"'
    assert systemd_quote('say "hi"') == '"say \\"hi\\""'
    assert systemd_quote("100%") == '"100%%"'
    assert systemd_quote("$HOME") == '"$$HOME"'
    assert exec_line(["/usr/bin/python3", "-c", "print(1 + 1)"]) == '/usr/bin/python3 -c "print(1 + 1)"'
    with pytest.raises(ValueError):
        systemd_quote("a\nb")


def test_quoted_arguments_reach_the_process_exactly(tmp_path: Path) -> None:
    """For arguments without `$` or `%`, systemd's word splitting agrees with POSIX shell rules; the
    end-to-end tests check the real argv of a started unit."""
    import shlex

    argv = ["/usr/bin/python3", "-c", 'import sys; print("a b", sys.argv)', "x y", "plain"]
    assert shlex.split(exec_line(argv)) == argv
