"""The OpenSSH argv builder (pure): pins by alias, escapes nested ProxyCommand tokens."""

from __future__ import annotations

import shlex
from pathlib import Path

from ddtreectl.inventory.models import Host
from ddtreectl.transport import openssh
from ddtreectl.transport.hostkeys import PublicKey

from tests.transport.sshd import keygen


def _opt(argv: list[str], name: str) -> str:
    values = [argv[i + 1].split("=", 1)[1] for i, a in enumerate(argv[:-1])
              if a == "-o" and argv[i + 1].startswith(name + "=")]
    assert len(values) == 1, (name, argv)
    return values[0]


def test_single_hop_pins_by_alias(tmp_path: Path) -> None:
    key = PublicKey.parse(keygen(tmp_path / "k"))
    host = Host(name="gpu1", address="10.0.0.5", port=2222, user="ops", identity_file="~/id",
                connect_timeout=2.5)
    argv = openssh.ssh_argv([(host, key)], "/x/known_hosts")
    assert argv[:3] == ["ssh", "-F", "/dev/null"]
    assert _opt(argv, "HostKeyAlias") == "ddtreectl-gpu1"
    assert _opt(argv, "StrictHostKeyChecking") == "yes" and _opt(argv, "BatchMode") == "yes"
    assert _opt(argv, "HostKeyAlgorithms") == "ssh-ed25519"
    assert _opt(argv, "ConnectTimeout") == "2"
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "ops"
    assert not argv[argv.index("-i") + 1].startswith("~")
    assert "10.0.0.5" not in argv  # rsync appends user@address itself
    assert openssh.known_hosts_text([(host, key)]) == f"ddtreectl-gpu1 {key.line}\n"


def test_two_jumps_nest_proxy_commands_with_escaped_tokens(tmp_path: Path) -> None:
    keys = [PublicKey.parse(keygen(tmp_path / f"k{i}")) for i in range(3)]
    hosts = [Host(name=n, address=f"10.0.0.{i + 1}") for i, n in enumerate(["edge", "mid", "gpu"])]
    argv = openssh.ssh_argv(list(zip(hosts, keys)), "/x/kh")
    assert _opt(argv, "HostKeyAlias") == "ddtreectl-gpu"
    outer = shlex.split(_opt(argv, "ProxyCommand"))
    # The target's ssh expands %h:%p (the target); the mid hop's own tokens arrive escaped.
    assert outer[-3:] == ["-W", "%h:%p", "10.0.0.2"]
    assert _opt(outer, "HostKeyAlias") == "ddtreectl-mid"
    inner = _opt(outer, "ProxyCommand")
    assert inner.endswith("-W %%h:%%p 10.0.0.1")
    assert "HostKeyAlias=ddtreectl-edge" in inner
    assert openssh.known_hosts_text(list(zip(hosts, keys))).count("\n") == 3
