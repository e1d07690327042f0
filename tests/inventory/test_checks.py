"""The pure value checks: what reaches a shell, an SSH config or a unit file is exactly one clean word."""

from __future__ import annotations

import pytest

from ddtreectl.inventory import checks

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqTY0Yb5LXTHgq8sV7bdqvnqSq8Rzt+nH1j3EBo+Kx2"

GOOD = [
    (checks.address_problem, "10.1.230.171"), (checks.address_problem, "fe80::1%eth0"),
    (checks.address_problem, "ct200.prod.example.com"), (checks.address_problem, "gpu-1"),
    (checks.name_problem, "ct200"), (checks.unit_problem, "sglang-k26-ddtree"),
    (checks.unit_problem, "sglang@rank1"), (checks.user_problem, "deploy"),
    (checks.env_name_problem, "CUDA_VISIBLE_DEVICES"), (checks.path_problem, "/opt/ddtree"),
    (checks.path_problem, "~/.local/share/ddtree"), (checks.model_path_problem, "moonshotai/Kimi-K2"),
    (checks.template_problem, "units/sglang.service.j2"), (checks.machine_id_problem, "0" * 32),
    (checks.gpu_uuid_problem, "GPU-8f1c2a3b-1111-2222-3333-444455556666"),
    (checks.interface_problem, "^lo,docker"), (checks.http_path_problem, "/health_generate"),
    (checks.python_problem, "/opt/venv/bin/python3"), (checks.module_problem, "sglang.launch_server"),
    (checks.host_key_problem, KEY), (checks.host_key_problem, KEY + " root@ct200"),
]


@pytest.mark.parametrize(("check", "value"), GOOD)
def test_good_values_pass(check, value) -> None:  # type: ignore[no-untyped-def]
    assert check(value) is None


@pytest.mark.parametrize(("check", "value"), GOOD)
def test_a_trailing_newline_never_passes(check, value) -> None:  # type: ignore[no-untyped-def]
    # `$` in a Python regex also matches before a final newline; a folded YAML scalar has one.
    assert check(value + "\n") is not None
    assert check(value + "\nExecStartPre=/bin/evil") is not None


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (checks.address_problem, "10.1.230."), (checks.address_problem, "10.1.230.256"),
        (checks.address_problem, "a..b"), (checks.address_problem, "x" * 64 + ".com"),
        (checks.address_problem, "host name"), (checks.name_problem, "-x"),
        (checks.unit_problem, "a.service"), (checks.unit_problem, "a b"), (checks.user_problem, "1root"),
        (checks.env_name_problem, "A-B"), (checks.path_problem, "opt"), (checks.path_problem, "/a/../b"),
        (checks.path_problem, "/a/$HOME"), (checks.path_problem, "~root/x"),
        (checks.model_path_problem, "Kimi"), (checks.template_problem, "../x.j2"),
        (checks.machine_id_problem, "A" * 32), (checks.gpu_uuid_problem, "0"),
        (checks.http_path_problem, "health"), (checks.python_problem, "python3"),
        (checks.module_problem, "1x"), (checks.host_key_problem, "ssh-dss AAAA"),
        (checks.host_key_problem, "ssh-ed25519 !!!"),
        (checks.host_key_problem, "ssh-rsa AAAAC3NzaC1lZDI1NTE5AAAAIHqTY0Yb5LXTHgq8sV7bdqvnqSq8Rzt+nH1j3EBo+Kx2"),
    ],
)
def test_bad_values_fail(check, value) -> None:  # type: ignore[no-untyped-def]
    assert check(value) is not None
