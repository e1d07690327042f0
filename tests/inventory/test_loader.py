"""Inventory loading: every bad case gives `file:line: key.path: message`, a hint and exit code 3."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddtreectl.errors import ExitCode, InventoryError
from ddtreectl.inventory.loader import load
from ddtreectl.inventory.models import HealthSettings

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "hosts.yaml"

GOOD = """\
defaults:
  user: deploy
  port: 2222
  identity_file: ~/.ssh/fleet
  connect_timeout: 3
services:
  svc:
    template: sglang-ddtree.service.j2
    port: 30000
    model_path: /models/m
    served_model_name: m
hosts:
  gpu1:
    address: 10.0.0.5
    gpus: 8
    role: prod
    service: svc
  gpu2:
    address: gpu2.example.com
    port: 22
    user: root
    jump_host: gpu1
  here:
    transport: local
    remote_root: ~/ddtree
groups:
  prod: [gpu1]
  all-gpu: [gpu1, gpu2]
"""


def write(tmp_path: Path, text: str, name: str = "hosts.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> InventoryError:
    path = write(tmp_path, text)
    os.chdir(tmp_path)  # the message names the file as given: use a relative path
    with pytest.raises(InventoryError) as info:
        load(Path(path.name))
    assert info.value.exit_code == ExitCode.INVENTORY == 3
    return info.value


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


# ---- keys ----------------------------------------------------------------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts: {}\nhots: {}\n")
    assert str(err) == "hosts.yaml:2: hots: unknown key 'hots' (did you mean 'hosts'?)"
    assert err.hint == "allowed keys at the top level: defaults, services, hosts, groups"


def test_unknown_host_key_suggests_the_closest(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  ct200:\n    adress: 10.0.0.1\n")
    assert str(err).splitlines()[0] == (
        "hosts.yaml:3: hosts.ct200.adress: unknown key 'adress' (did you mean 'address'?)"
    )
    assert err.hint is not None and err.hint.startswith("allowed keys in a host: address, port, user,")


def test_unknown_keys_in_service_health_and_defaults(tmp_path: Path) -> None:
    err = error_of(tmp_path, """\
        defaults:
          usr: root
          address: 10.0.0.1
        services:
          s:
            template: t.j2
            port: 1
            model_path: /m
            served_model_name: m
            healt: {}
            health: {readines_path: /x}
        hosts: {}
        """)
    assert str(err) == "\n".join([
        "hosts.yaml:2: defaults.usr: unknown key 'usr' (did you mean 'user'?)",
        "3 more problems:",
        "  hosts.yaml:3: defaults.address: 'address' cannot have a default: it identifies one host",
        "  hosts.yaml:10: services.s.healt: unknown key 'healt' (did you mean 'health'?)",
        "  hosts.yaml:11: services.s.health.readines_path: unknown key 'readines_path'"
        " (did you mean 'readiness_path'?)",
    ])


def test_duplicate_host_names(tmp_path: Path) -> None:
    err = error_of(tmp_path, """\
        hosts:
          ct200:
            address: 10.0.0.1
          local:
            transport: local
          ct200:
            address: 10.0.0.2
        """)
    assert str(err) == "hosts.yaml:6: hosts.ct200: duplicate key 'ct200' (first defined at line 2)"
    assert err.hint and "silently" in err.hint


def test_duplicate_keys_inside_a_host_and_in_flow_style(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  a: {address: 10.0.0.1, gpus: 1, gpus: 2}\n")
    assert str(err) == "hosts.yaml:2: hosts.a.gpus: duplicate key 'gpus' (first defined at line 2)"


def test_duplicate_top_level_section(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts: {}\ngroups: {}\nhosts: {}\n")
    assert str(err) == "hosts.yaml:3: hosts: duplicate key 'hosts' (first defined at line 1)"


# ---- values --------------------------------------------------------------------------------------


def host_error(tmp_path: Path, lines: str) -> str:
    """The error for one host `ct200` whose body is `lines` (the first body line is line 3)."""
    body = "".join(f"    {line}\n" for line in lines.splitlines())
    return str(error_of(tmp_path, "hosts:\n  ct200:\n" + body))


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("address: 10.1.230.", 3, "hosts.ct200.address: '10.1.230.' is not an IP address or hostname"),
        ("address: 10.1.230.256", 3, "hosts.ct200.address: '10.1.230.256' is not an IP address or hostname"),
        ("address: -bad-.example", 3, "hosts.ct200.address: '-bad-.example' is not an IP address or hostname"),
        ("address: host_1", 3, "hosts.ct200.address: 'host_1' is not an IP address or hostname"),
        ("address: '[::1]'", 3, "hosts.ct200.address: '[::1]' is not an IP address or hostname"),
        ("address: [10.0.0.1]", 3, "hosts.ct200.address: expected a string, got a list"),
        ("address:\n  ip: 10.0.0.1", 4, "hosts.ct200.address: expected a string, got a mapping"),
        ("address: 10.0.0.1\nport: 0", 4, "hosts.ct200.port: 0 is out of range 1..65535"),
        ("address: 10.0.0.1\nport: 65536", 4, "hosts.ct200.port: 65536 is out of range 1..65535"),
        ("address: 10.0.0.1\nport: ssh", 4, "hosts.ct200.port: expected an integer, got a string ('ssh')"),
        ("address: 10.0.0.1\nport: 22.5", 4, "hosts.ct200.port: expected an integer, got a number ('22.5')"),
        ("address: 10.0.0.1\nport: true", 4, "hosts.ct200.port: expected an integer, got a boolean ('true')"),
        ("address: 10.0.0.1\nrole: production", 4, "hosts.ct200.role: 'production' is not one of: prod, dev"),
        ("address: 10.0.0.1\ntransport: telnet", 4, "hosts.ct200.transport: 'telnet' is not one of: ssh, local"),
        ("address: 10.0.0.1\ngpus: -1", 4, "hosts.ct200.gpus: -1 is less than 0"),
        ("address: 10.0.0.1\nuser: 'root; rm -rf /'", 4, "hosts.ct200.user: 'root; rm -rf /' is not a valid user name"),
        ("address: 10.0.0.1\nremote_root: opt/ddtree", 4,
         "hosts.ct200.remote_root: 'opt/ddtree' must be an absolute path or start with '~/'"),
        ("address: 10.0.0.1\nremote_root: /opt/dd tree", 4,
         "hosts.ct200.remote_root: '/opt/dd tree' contains characters that are unsafe in a path"
         " (spaces, quotes, '%', '$', ...)"),
        ("address: 10.0.0.1\nremote_root: /opt/../etc", 4,
         "hosts.ct200.remote_root: '/opt/../etc' must not contain '..' components"),
        ("address: 10.0.0.1\nidentity_file: id_ed25519", 4,
         "hosts.ct200.identity_file: 'id_ed25519' must be an absolute path or start with '~/'"),
        ("address: 10.0.0.1\nhost_key: AAAAC3Nza", 4,
         "hosts.ct200.host_key: 'AAAAC3Nza' is not a public host key ('ssh-ed25519 AAAA...')"),
        ("address: 10.0.0.1\nhost_key: ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==", 4,
         "hosts.ct200.host_key: 'ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==' is not a valid ssh-ed25519 key"
         " (the key data does not match its type)"),
        ("address: 10.0.0.1\nmachine_id: xyz", 4,
         "hosts.ct200.machine_id: 'xyz' is not a machine-id (32 lowercase hex digits)"),
        ("address: 10.0.0.1\ngpu_uuids: [GPU-0123abcd-0000, nope]", 4,
         "hosts.ct200.gpu_uuids[1]: 'nope' is not a GPU UUID ('GPU-...' as nvidia-smi prints)"),
        ("address: 10.0.0.1\nconnect_timeout: 0", 4, "hosts.ct200.connect_timeout: 0 must be a positive number of seconds"),
        ("address: 10.0.0.1\nkeep_releases: 1", 4, "hosts.ct200.keep_releases: 1 is less than 2"),
    ],
)
def test_bad_host_values(tmp_path: Path, body: str, line: int, message: str) -> None:
    assert host_error(tmp_path, body) == f"hosts.yaml:{line}: {message}"


def test_address_error_hint(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  ct200:\n    address: 10.1.230.\n")
    assert str(err) == "hosts.yaml:3: hosts.ct200.address: '10.1.230.' is not an IP address or hostname"
    assert err.hint == "use an IPv4/IPv6 address or a DNS host name"


def test_missing_address_for_ssh_host(tmp_path: Path) -> None:
    assert host_error(tmp_path, "gpus: 1") == "hosts.yaml:2: hosts.ct200: missing required key 'address'"


def test_a_list_where_a_mapping_is_expected(tmp_path: Path) -> None:
    assert str(error_of(tmp_path, "hosts:\n  - ct200\n")) == (
        "hosts.yaml:2: hosts: expected a mapping of host names, got a list"
    )
    assert str(error_of(tmp_path, "hosts:\n  ct200: [10.0.0.1]\n")) == (
        "hosts.yaml:2: hosts.ct200: expected a mapping, got a list"
    )


def test_bad_host_and_group_names(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  'ct 200': {address: 10.0.0.1}\n  all: {address: 10.0.0.2}\n")
    assert str(err).splitlines()[0] == (
        "hosts.yaml:2: hosts.ct 200: 'ct 200' is not a valid name (letters, digits, '_', '.', '-';"
        " starting with a letter or digit)"
    )
    assert str(err).splitlines()[2] == "  hosts.yaml:3: hosts.all: 'all' is reserved (it means every host)"


# ---- cross references ----------------------------------------------------------------------------


def test_group_naming_unknown_host(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  ct200: {address: 10.0.0.1}\ngroups:\n  prod: [ct200, ct201]\n")
    assert str(err) == "hosts.yaml:4: groups.prod[1]: group 'prod' names unknown host 'ct201' (did you mean 'ct200'?)"
    assert err.hint == "hosts: ct200"


def test_group_named_like_a_host(tmp_path: Path) -> None:
    err = error_of(tmp_path, "hosts:\n  a: {address: 10.0.0.1}\ngroups:\n  a: [a]\n")
    assert str(err) == "hosts.yaml:4: groups.a: group 'a' has the same name as a host"


def test_unknown_service_profile(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("service: svc", "service: svk"))
    assert str(err) == "hosts.yaml:17: hosts.gpu1.service: unknown service profile 'svk' (did you mean 'svc'?)"
    assert err.hint == "profiles: svc"


def test_unknown_jump_host(tmp_path: Path) -> None:
    err = error_of(tmp_path, GOOD.replace("jump_host: gpu1", "jump_host: gpu9"))
    assert str(err) == "hosts.yaml:22: hosts.gpu2.jump_host: unknown jump host 'gpu9' (did you mean 'gpu2'?)"


def test_jump_host_loop_and_local_jump(tmp_path: Path) -> None:
    err = error_of(tmp_path, """\
        hosts:
          a: {address: 10.0.0.1, jump_host: b}
          b: {address: 10.0.0.2, jump_host: a}
          c: {address: 10.0.0.3, jump_host: l}
          l: {transport: local}
        """)
    lines = str(err).splitlines()
    assert lines[0] == "hosts.yaml:2: hosts.a.jump_host: jump hosts form a loop: a -> b -> a"
    assert "  hosts.yaml:4: hosts.c.jump_host: jump host 'l' uses the local transport; it must be an SSH host" in lines


def test_service_profile_values(tmp_path: Path) -> None:
    err = error_of(tmp_path, """\
        services:
          svc:
            template: /etc/t.j2
            port: 99999
            model_path: Kimi-K2.6
            served_model_name: m
            unit_name: svc.service
            environment: {1BAD: x}
            extra_args: ["--a\\nExecStartPre=/bin/evil"]
            tp_size: 0
            python: python3
        hosts: {}
        """)
    assert str(err).splitlines() == [
        "hosts.yaml:3: services.svc.template: '/etc/t.j2' must be relative to the templates/ directory",
        "7 more problems:",
        "  hosts.yaml:4: services.svc.port: 99999 is out of range 1..65535",
        "  hosts.yaml:5: services.svc.model_path: 'Kimi-K2.6' must be an absolute path, a '~/' path"
        " or a Hugging Face id 'org/name'",
        "  hosts.yaml:7: services.svc.unit_name: 'svc.service' must be given without the '.service' suffix",
        "  hosts.yaml:8: services.svc.environment.1BAD: '1BAD' is not a valid environment variable name"
        " ([A-Za-z_][A-Za-z0-9_]*)",
        "  hosts.yaml:9: services.svc.extra_args[0]: '--a\\nExecStartPre=/bin/evil' contains control characters"
        " (newline, tab, NUL, ...)",
        "  hosts.yaml:10: services.svc.tp_size: 0 is less than 1",
        "  hosts.yaml:11: services.svc.python: 'python3' must be an absolute path (systemd does not search PATH)",
    ]


def test_service_missing_required_keys(tmp_path: Path) -> None:
    err = error_of(tmp_path, "services:\n  svc:\n    template: t.j2\nhosts: {}\n")
    assert str(err).splitlines() == [
        "hosts.yaml:2: services.svc: missing required key 'port'",
        "2 more problems:",
        "  hosts.yaml:2: services.svc: missing required key 'model_path'",
        "  hosts.yaml:2: services.svc: missing required key 'served_model_name'",
    ]


def test_multi_node_profile_nodes_must_exist(tmp_path: Path) -> None:
    err = error_of(tmp_path, """\
        services:
          mn:
            template: t.j2
            port: 30000
            model_path: /m
            served_model_name: m
            nodes: [n0, n2]
            dist_init_port: 5000
        hosts:
          n0: {address: 10.0.0.1, service: mn}
          n1: {address: 10.0.0.2, service: mn}
        """)
    assert str(err).splitlines() == [
        "hosts.yaml:7: services.mn.nodes[1]: unknown host 'n2'",
        "1 more problem:",
        "  hosts.yaml:11: hosts.n1.service: host 'n1' runs multi-node profile 'mn' but is not one of its nodes",
    ]


def test_multi_node_profile_needs_dist_init_port(tmp_path: Path) -> None:
    err = error_of(tmp_path, """\
        services:
          mn: {template: t.j2, port: 1, model_path: /m, served_model_name: m, nodes: [n0]}
        hosts:
          n0: {address: 10.0.0.1}
        """)
    assert str(err) == "hosts.yaml:2: services.mn: a multi-node profile (nodes:) needs dist_init_port:"
