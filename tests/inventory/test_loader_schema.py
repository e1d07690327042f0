"""Inventory loading, part 2: unknown and duplicate keys, bad values and broken cross references. Every
bad case gives `file:line: key.path: message`, a hint and exit code 3 (part 1: test_loader.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.inventory.loader_cases import GOOD, error_of


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


def test_a_mistyped_transport_is_the_only_error_and_gets_the_closest_value(tmp_path: Path) -> None:
    """`transport: locl` was reported second, after "missing required key 'address'" (its consequence:
    an invalid transport read as ssh), which sent the reader to add an address to a local host."""
    err = error_of(tmp_path, "hosts:\n  ct200:\n    transport: locl\n")
    assert str(err) == "hosts.yaml:3: hosts.ct200.transport: 'locl' is not one of: ssh, local (did you mean 'local'?)"
    assert host_error(tmp_path, "gpus: 1\ntransport: ssh") == "hosts.yaml:2: hosts.ct200: missing required key 'address'"


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
