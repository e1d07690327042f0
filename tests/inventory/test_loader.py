"""Inventory loading, part 1: a good inventory, and problems with the file itself. Every bad case gives
`file:line: key.path: message`, a hint and exit code 3 (part 2: tests/inventory/test_loader_schema.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtreectl.errors import InventoryError
from ddtreectl.inventory.loader import load
from ddtreectl.inventory.models import HealthSettings
from tests.inventory.loader_cases import GOOD, error_of, write

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "hosts.yaml"


# ---- a good inventory ---------------------------------------------------------------------------


def test_good_inventory_builds_models_with_defaults_merged(tmp_path: Path) -> None:
    inv = load(write(tmp_path, GOOD))
    assert list(inv.hosts) == ["gpu1", "gpu2", "here"]
    gpu1, gpu2, here = inv.hosts["gpu1"], inv.hosts["gpu2"], inv.hosts["here"]
    # defaults apply ...
    assert (gpu1.user, gpu1.port, gpu1.connect_timeout) == ("deploy", 2222, 3.0)
    assert gpu1.identity_file == os.path.expanduser("~/.ssh/fleet")
    # ... and host keys override them
    assert (gpu2.user, gpu2.port) == ("root", 22)
    assert (gpu1.gpus, gpu1.role, gpu1.service, gpu1.host_key) == (8, "prod", "svc", None)
    assert gpu2.jump_host == "gpu1" and gpu2.gpus == 0 and gpu2.role == "dev"
    assert here.transport == "local" and here.address == "127.0.0.1"
    assert here.remote_root == os.path.join(os.path.expanduser("~"), "ddtree")
    assert gpu1.remote_root == "/opt/ddtree"
    assert (gpu1.line, gpu2.line, here.line) == (13, 18, 23)
    assert inv.groups == {"prod": ("gpu1",), "all-gpu": ("gpu1", "gpu2")}
    svc = inv.services["svc"]
    assert (svc.port, svc.tp_size, svc.unit) == (30000, 1, "svc.service")
    assert svc.health == HealthSettings()
    assert inv.service_of(gpu1) is svc and inv.service_of(gpu2) is None
    assert [h.name for h in inv.resolve(["prod", "gpu2", "gpu1"])] == ["gpu1", "gpu2"]


def test_full_service_profile_and_identity_fields(tmp_path: Path) -> None:
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqTY0Yb5LXTHgq8sV7bdqvnqSq8Rzt+nH1j3EBo+Kx2 root@a"
    inv = load(write(tmp_path, f"""\
        services:
          k26:
            template: t.j2
            port: 0x7530
            model_path: moonshotai/Kimi-K2
            served_model_name: kimi
            tp_size: 16
            unit_name: sglang-k26
            extra_args: [--enable-metrics, "--mem-fraction-static=0.9"]
            environment: {{NCCL_DEBUG: WARN, OMP_NUM_THREADS: 8, FLAG: yes}}
            speculative: {{algorithm: DDTREE, num_draft_tokens: 16, ratio: 0.5}}
            nodes: [a, b]
            dist_init_port: 5000
            nccl_interface: "^lo,docker"
            health: {{readiness_path: /health, total_timeout: 90.5}}
        hosts:
          a:
            address: "fe80::1%eth0"
            service: k26
            host_key: {key}
            machine_id: 0123456789abcdef0123456789abcdef
            gpu_uuids: [GPU-8f1c2a3b-1111-2222-3333-444455556666]
          b: {{address: 10.0.0.2, service: k26}}
        """))
    p = inv.services["k26"]
    assert p.port == 30000 and p.unit == "sglang-k26.service" and p.tp_size == 16
    assert p.extra_args == ("--enable-metrics", "--mem-fraction-static=0.9")
    assert p.environment == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8", "FLAG": "yes"}
    assert p.speculative == {"algorithm": "DDTREE", "num_draft_tokens": 16, "ratio": 0.5}
    assert p.nodes == ("a", "b") and p.dist_init_port == 5000 and p.nccl_interface == "^lo,docker"
    assert p.health.readiness_path == "/health" and p.health.total_timeout == 90.5
    a = inv.hosts["a"]
    assert a.address == "fe80::1%eth0" and a.host_key == key
    assert [w.host for w in inv.warnings] == ["a"]  # accepted, with a warning (test_scoped_address_...)
    assert a.machine_id == "0123456789abcdef0123456789abcdef"
    assert a.gpu_uuids == ("GPU-8f1c2a3b-1111-2222-3333-444455556666",)


def test_anchors_and_merge_keys(tmp_path: Path) -> None:
    inv = load(write(tmp_path, """\
        hosts:
          a: &base {address: 10.0.0.1, gpus: 4, role: prod}
          b:
            <<: *base
            address: 10.0.0.2
        """))
    assert (inv.hosts["b"].address, inv.hosts["b"].gpus, inv.hosts["b"].role) == ("10.0.0.2", 4, "prod")


def test_jump_host_in_defaults_does_not_loop_on_the_bastion(tmp_path: Path) -> None:
    inv = load(write(tmp_path, """\
        defaults: {jump_host: bastion}
        hosts:
          bastion: {address: 192.0.2.1}
          gpu: {address: 10.0.0.9}
          here: {transport: local}
        """))
    assert inv.hosts["bastion"].jump_host is None and inv.hosts["gpu"].jump_host == "bastion"
    assert inv.hosts["here"].jump_host is None


def test_explicit_jump_host_on_a_local_host(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  b: {address: 10.0.0.1}\n  here: {transport: local, jump_host: b}\n")
    assert str(err) == "hosts.yaml:3: hosts.here.jump_host: a local host cannot use a jump host"


def test_shipped_inventory_loads(tmp_path: Path) -> None:
    inv = load(SHIPPED)
    assert set(inv.hosts) == {"ct200", "local"}
    ct200 = inv.hosts["ct200"]
    assert (ct200.address, ct200.gpus, ct200.role, ct200.service) == ("10.1.230.171", 8, "prod", "sglang-k26-ddtree")
    assert ct200.host_key is None  # not trusted yet: `ddtreectl trust ct200`
    assert inv.hosts["local"].transport == "local"
    assert inv.services["sglang-k26-ddtree"].tp_size == 8
    assert inv.groups["prod"] == ("ct200",)


# ---- file-level problems -------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        load(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path}/nope.yaml: inventory file not found"
    assert "DDTREECTL_INVENTORY" in (info.value.hint or "")


def test_unreadable_file(tmp_path: Path) -> None:
    """Root reads any file, so the loader runs as `nobody` (setpriv) on a 0600 root-owned file."""
    path = write(tmp_path, GOOD)
    path.chmod(0o600)
    tmp_path.chmod(0o755)
    code = (
        "import sys; from pathlib import Path; from ddtreectl.inventory.loader import load\n"
        "try:\n    load(Path(sys.argv[1]))\n"
        "except Exception as e:\n    print(type(e).__name__, e.exit_code, e, sep='|')\n"
    )
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    if prefix and not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to drop root")
    proc = subprocess.run([*prefix, sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=60, cwd="/", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.strip() == f"InventoryError|3|{path}: cannot read the inventory: permission denied", proc.stderr


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="is a directory"):
        load(tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_bytes(b"hosts:\n  a:\n    address: caf\xe9\n")
    with pytest.raises(InventoryError) as info:
        load(path)
    assert str(info.value) == f"{path}:3: the inventory is not UTF-8 text"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hosts:\n  a:\n    address: 10.0.0.1\n   port: 22\n",
         "hosts.yaml:4:4: malformed YAML: while parsing a block mapping did not find expected key"),
        ("hosts:\n  a: {address: 10.0.0.1\n",
         "hosts.yaml:3:1: malformed YAML: while parsing a flow mapping did not find expected ',' or '}'"),
        ('hosts:\n  a:\n    address: "10.0.0.1\n',
         "hosts.yaml:4:1: malformed YAML: while scanning a quoted scalar found unexpected end of stream"),
    ],
)
def test_malformed_yaml(tmp_path: Path, text: str, message: str) -> None:
    err = error_of(tmp_path, text)
    assert str(err) == message
    assert err.hint and "syntax" in err.hint


def test_empty_file(tmp_path: Path) -> None:
    assert str(error_of(tmp_path, "# nothing\n")) == "hosts.yaml:1: the inventory is empty"


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    err = error_of(tmp_path, "- ct200\n- local\n")
    assert str(err) == (
        "hosts.yaml:1: expected a mapping with hosts:, services:, groups:, defaults:, got a list"
    )


def test_missing_hosts_section(tmp_path: Path) -> None:
    assert str(error_of(tmp_path, "groups: {}\n")) == "hosts.yaml:1: missing required section 'hosts:'"


def test_scoped_address_is_accepted_with_a_warning_naming_file_line_and_host(tmp_path: Path) -> None:
    """`fe80::1%eth0` reaches the host only from the machine whose eth0 it names; set-ip refuses to write
    one. The loader still accepts it (an error would stop every command for every host, set-ip that
    repairs it included), but says what is wrong where, in set-ip's words, with what to type."""
    path = write(tmp_path, """\
        hosts:
          a: {address: 10.0.0.1}
          b:
            port: 22
            address: "fe80::1%eth0"
          c: {address: "2001:db8::5%bond0"}
        """)
    inv = load(path)
    assert inv.hosts["b"].address == "fe80::1%eth0"
    b, c = inv.warnings
    assert (b.host, c.host, inv.warnings_of("a"), inv.warnings_of("c")) == ("b", "c", (), (c,))
    assert b.message == (f"{path}:5: hosts.b.address: 'fe80::1%eth0' carries a zone index (%eth0), which names a "
                         "network interface of the machine it is typed on; an inventory is shared and read on "
                         "other machines, where eth0 is another link or none")
    assert b.hint.startswith("fe80::1 is link-local and cannot be reached without a zone: give b's global")
    assert c.message.startswith(f"{path}:6: hosts.c.address: '2001:db8::5%bond0' carries a zone index (%bond0)")
    assert c.hint == "give the address without its zone: `ddtreectl set-ip c 2001:db8::5`"
