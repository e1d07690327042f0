"""set-ip without a network: validation, refusals, dry run, the sweeps, and a full move of a
`local`-transport host (real grep, real files, real audit log). Every address here is loopback.
The SSH end-to-end cases are in test_set_ip_testbed.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ddtreectl.cli.main import run
from ddtreectl.inventory.loader import load
from ddtreectl.operations.stale_refs import (
    address_pattern,
    parse_remote_sweep,
    remote_sweep_command,
    sweep_project,
)
from ddtreectl.transport.local import LocalTransport

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqTY0Yb5LXTHgq8sV7bdqvnqSq8Rzt+nH1j3EBo+Kx2"


def project(tmp_path: Path, *, extra_hosts: str = "") -> Path:
    """A project dir: inventory with two local hosts, a template and a README naming the old address."""
    root = tmp_path / "proj"
    (root / "templates").mkdir(parents=True)
    (root / "build").mkdir()
    (tmp_path / "here-root" / "releases" / "r1").mkdir(parents=True)
    (tmp_path / "here-root" / "releases" / "r1" / "config.yaml").write_text("host: 127.0.0.71\n")
    (tmp_path / "other-root").mkdir()
    (root / "hosts.yaml").write_text(
        "# test inventory\n"
        "hosts:\n"
        "  here:\n"
        "    transport: local\n"
        "    address: '127.0.0.71'   # quoted on purpose\n"
        f"    remote_root: {tmp_path}/here-root\n"
        "  other:\n"
        "    transport: local\n"
        "    address: 127.0.0.72\n"
        f"    remote_root: {tmp_path}/other-root\n"
        + extra_hosts
    )
    (root / "templates" / "peer.service.j2").write_text(
        "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --dist-init-addr 127.0.0.71:5000\n"
    )
    (root / "README.md").write_text("Not stale: 127.0.0.710 and 1127.0.0.71.\nStale: ssh root@127.0.0.71\n")
    (root / "build" / "out.txt").write_text("127.0.0.71\n")  # a build output: never reported
    (root / "blob.bin").write_bytes(b"\x00\x01127.0.0.71")  # binary: skipped
    return root


def cli(root: Path, *args: str) -> int:
    return run(["-i", str(root / "hosts.yaml"), *args])


# ---- matching and sweeping -----------------------------------------------------------------------


def test_address_pattern_matches_whole_addresses_only() -> None:
    p = address_pattern("10.1.2.200")
    for hit in ("10.1.2.200", "--dist-init-addr 10.1.2.200:5000", "root@10.1.2.200", "at 10.1.2.200.",
                "'10.1.2.200'", "http://10.1.2.200/x", "host=10.1.2.200,"):
        assert p.search(hit), hit
    for miss in ("110.1.2.200", "10.1.2.2001", "10.1.2.200.5", "10.1.2.20", "a10.1.2.200", "10.1.2.200-b"):
        assert not p.search(miss), miss
    v6 = address_pattern("fe80::1")
    assert v6.search("[fe80::1]:22") and v6.search("addr fe80::1\n")
    assert not v6.search("fe80::12") and not v6.search("fe80::1:2") and not v6.search("2fe80::1")


def test_sweep_project_walk(tmp_path: Path) -> None:
    root = project(tmp_path)
    refs, skipped = sweep_project(root, "127.0.0.71")
    assert [r.describe() for r in refs] == [
        "README.md:2: Stale: ssh root@127.0.0.71",
        "hosts.yaml:5: address: '127.0.0.71'   # quoted on purpose",
        "templates/peer.service.j2:2: ExecStart=/usr/bin/python3 -m sglang.launch_server"
        " --dist-init-addr 127.0.0.71:5000",
    ]
    assert skipped == []


def test_sweep_project_git_respects_gitignore_and_overrides(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / ".gitignore").write_text("/templates/*.rendered\n")
    (root / "templates" / "x.rendered").write_text("127.0.0.71\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "hosts.yaml"], check=True)
    new_inventory = (root / "hosts.yaml").read_text().replace("127.0.0.71", "127.0.0.99")
    refs, _ = sweep_project(root, "127.0.0.71", contents={root / "hosts.yaml": new_inventory})
    assert [r.path for r in refs] == ["README.md", "templates/peer.service.j2"]


def test_remote_sweep_command_with_real_grep(tmp_path: Path) -> None:
    """The one remote command, run by a real /bin/sh + grep on this machine (local transport)."""
    rroot = tmp_path / "remote root"
    (rroot / "releases" / "r1").mkdir(parents=True)
    (rroot / "releases" / "r1" / "node.yaml").write_text("a: 1\ndist_init_addr: 127.0.0.71:5000\n")
    (rroot / "releases" / "r1" / "other.yaml").write_text("x: 127.0.0.710\n")  # not the address
    (rroot / "releases" / "r1" / "lib.so").write_bytes(b"\x7fELF\x00127.0.0.71")  # binary
    (rroot / "state").mkdir()
    (rroot / "state" / "audit.log").write_text('{"old": "127.0.0.71"}\n')  # logged on purpose
    host = load_local_host(tmp_path)
    with LocalTransport(host) as t:
        result = t.run(remote_sweep_command("127.0.0.71", str(rroot)), timeout=30)
        assert result.ok, result.stderr
        refs = parse_remote_sweep(result.stdout, "127.0.0.71")
        assert [r.describe() for r in refs] == [f"{rroot}/releases/r1/node.yaml:2: dist_init_addr: 127.0.0.71:5000"]
        missing = t.run(remote_sweep_command("127.0.0.71", str(tmp_path / "nope")), timeout=30)
        assert missing.ok  # an absent remote root is not an error: nothing is installed there


def load_local_host(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "one.yaml"
    path.write_text("hosts:\n  me: {transport: local}\n")
    return load(path).hosts["me"]


# ---- refusals: exit 3 / 4, file untouched --------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["here", "127.0.0."], 3, "error: set-ip: '127.0.0.' is not an IP address or hostname"),
        (["here", "bad_host!"], 3, "error: set-ip: 'bad_host!' is not an IP address or hostname"),
        (["nohost", "127.0.0.5"], 3, "error: hosts.yaml: no host named 'nohost' (known: here, other)"),
        (["here", "127.0.0.72"], 3, "error: set-ip: 127.0.0.72 is already the address of other"),
    ],
)
def test_refusals_leave_the_file_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    root = project(tmp_path)
    before = (root / "hosts.yaml").read_bytes()
    os.chdir(root)
    assert run(["-i", "hosts.yaml", "set-ip", *args]) == code
    err = capsys.readouterr().err.splitlines()
    assert err[0] == message and err[-1].startswith("hint: ")
    assert (root / "hosts.yaml").read_bytes() == before


@pytest.mark.parametrize(("typed", "hint"), [
    ("127.0.0.5/16", "give the address without its prefix length: 127.0.0.5"),  # copied from `ip addr`
    ("127.0.0.5:22", "give the address alone: 127.0.0.5 (the SSH port is `port:` in the inventory)"),
    ("[::1]:22", "give the address without brackets: ::1 (the SSH port is `port:` in the inventory)"),
    (" 127.0.0.5", "give the address without the surrounding spaces: 127.0.0.5"),
    ("1.2.3", "give an IPv4 address (10.1.230.171), an IPv6 address or a DNS host name"),
])
def test_a_mistyped_address_gets_the_form_to_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], typed: str, hint: str
) -> None:
    """The hint used to list the accepted forms whatever was typed; for the forms an operator copies
    from `ip addr` or an ssh command line it now gives the address to type."""
    root = project(tmp_path)
    assert cli(root, "set-ip", "here", typed, "--no-verify") == 3
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"error: set-ip: {typed!r} is not an IP address or hostname" and err[-1] == f"hint: {hint}"


def test_ssh_host_without_pinned_key_is_refused_before_connecting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, extra_hosts="  box: {address: 127.0.0.73, port: 1}\n")
    before = (root / "hosts.yaml").read_bytes()
    assert cli(root, "set-ip", "box", "127.0.0.74") == 4
    err = capsys.readouterr().err
    assert "no host key is pinned for box" in err and "the inventory was not changed" in err
    assert "--no-verify" in err
    assert (root / "hosts.yaml").read_bytes() == before


def test_unreachable_new_address_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # port 1 on loopback: connection refused at once (nothing listens there)
    root = project(tmp_path, extra_hosts=f"  box: {{address: 127.0.0.73, port: 1, host_key: {KEY}}}\n")
    before = (root / "hosts.yaml").read_bytes()
    assert cli(root, "set-ip", "box", "127.0.0.74") == 4
    err = capsys.readouterr().err.splitlines()
    assert err[0] == ("error: box: cannot verify box at 127.0.0.74: cannot reach 127.0.0.74:1: "
                      "connection refused; the inventory was not changed")
    assert (root / "hosts.yaml").read_bytes() == before


def test_force_allows_a_taken_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path)
    assert cli(root, "set-ip", "here", "127.0.0.72", "--force", "--dry-run", "--no-verify") == 0
    assert "would move 127.0.0.71 -> 127.0.0.72" in capsys.readouterr().out


# ---- dry run and a real move of a local host -----------------------------------------------------


def test_dry_run_prints_the_diff_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path)
    before = (root / "hosts.yaml").read_bytes()
    assert cli(root, "set-ip", "here", "127.0.0.81", "--dry-run", "--no-verify") == 0
    out = capsys.readouterr().out
    assert "-    address: '127.0.0.71'   # quoted on purpose\n+    address: '127.0.0.81'   # quoted on purpose" in out
    assert "stale: templates/peer.service.j2:2:" in out
    assert "hosts.yaml:5" not in out  # the inventory is swept as it would be after the edit
    assert out.rstrip().splitlines()[-1].endswith("dry run: nothing written")
    # the units to re-render come with the command that does it (there is no `re-render` command)
    assert "re-render units on here: `ddtreectl deploy here --plan` shows the unit diff, " \
           "`ddtreectl deploy here` installs them" in out, out
    assert (root / "hosts.yaml").read_bytes() == before
    assert not (tmp_path / "here-root" / "state").exists()  # no audit line in a dry run


def test_move_local_host_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path)
    before = (root / "hosts.yaml").read_text()
    assert cli(root, "set-ip", "here", "127.0.0.81", "--json", "--no-verify") == 0
    doc = json.loads(capsys.readouterr().out)
    after = (root / "hosts.yaml").read_text()
    assert after == before.replace("'127.0.0.71'", "'127.0.0.81'")
    assert load(root / "hosts.yaml").hosts["here"].address == "127.0.0.81"
    assert doc["schema"] == "ddtreectl.set-ip/1" and doc["changed"] and not doc["dry_run"]
    assert (doc["old"], doc["new"]) == ("127.0.0.71", "127.0.0.81")
    assert [(r["path"], r["line"]) for r in doc["project_refs"]] == [
        ("README.md", 2), ("templates/peer.service.j2", 2)]
    assert doc["hosts"]["here"]["needs_rerender"] and doc["rerender_hosts"] == ["here"]
    assert doc["hosts"]["here"]["refs"] == [
        {"path": f"{tmp_path}/here-root/releases/r1/config.yaml", "line": 1, "text": "host: 127.0.0.71"}]
    assert doc["hosts"]["other"] == {"swept": True, "error": None, "needs_rerender": False, "refs": []}
    assert doc["audit"] == "written"
    audit = [json.loads(line) for line in (tmp_path / "here-root/state/audit.log").read_text().splitlines()]
    assert len(audit) == 1
    assert {k: audit[0][k] for k in ("action", "host", "old", "new")} == {
        "action": "set-ip", "host": "here", "old": "127.0.0.71", "new": "127.0.0.81"}
    assert audit[0]["time"].endswith("Z") and audit[0]["by"]
    # once moved, a second run has nothing to do
    assert cli(root, "set-ip", "here", "127.0.0.81") == 0
    assert "already at 127.0.0.81" in capsys.readouterr().out


def test_rank0_of_a_multi_node_profile_names_every_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path)
    path = root / "hosts.yaml"
    path.write_text(
        "services:\n  mn:\n    template: sglang-ddtree.service.j2\n    port: 30000\n"
        "    model_path: /models/m\n    served_model_name: m\n    nodes: [here, other]\n"
        "    dist_init_port: 5000\n" + path.read_text().replace("    transport: local\n", "    transport: local\n    service: mn\n"))
    assert cli(root, "set-ip", "here", "127.0.0.81", "--json", "--no-verify") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rank0_peers"] == ["here", "other"]
    assert doc["rerender_hosts"] == ["here", "other"]  # `other` by the profile, not (yet) by grep
    assert not doc["hosts"]["other"]["needs_rerender"]


def test_a_local_host_is_refused_without_no_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A `local` host is never connected to, so nothing proves the machine at the new address is it.
    set-ip used to write the address, report "identity: local transport: no host key to check" and
    audit the move on this machine (even with a recorded machine-id, which only ever matched this
    machine's). Now it is refused naming the file, line, host and the two ways on; --no-verify
    records it, saying it was not verified."""
    root = project(tmp_path)
    path = root / "hosts.yaml"
    path.write_text(path.read_text().replace(
        "  other:", f"    machine_id: {Path('/etc/machine-id').read_text().strip()}\n  other:"))
    before = path.read_bytes()
    for extra in ([], ["--json"]):
        assert cli(root, "set-ip", "here", "127.0.0.91", *extra) == 3
        captured = capsys.readouterr()
        error = json.loads(captured.out)["error"] if extra else {
            "message": captured.err.splitlines()[0].removeprefix("error: "),
            "hint": captured.err.splitlines()[-1].removeprefix("hint: ")}
        assert error["message"] == (
            "hosts.yaml:3: hosts.here uses `transport: local`: ddtreectl runs its commands on this machine and "
            "never connects to an address, so set-ip cannot prove that the machine at 127.0.0.91 is here; "
            "the inventory was not changed"), error
        assert "set `transport: ssh` and `address: 127.0.0.91`" in error["hint"], error
        assert "`ddtreectl trust here`" in error["hint"], error
        assert "`ddtreectl set-ip here 127.0.0.91 --no-verify`" in error["hint"], error
        assert path.read_bytes() == before
    assert not (tmp_path / "here-root" / "state").exists()  # no audit line either
    assert cli(root, "set-ip", "here", "127.0.0.91", "--no-verify", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["changed"], doc["verified"], doc["new"]) == (True, False, "127.0.0.91"), doc
    assert load(path).hosts["here"].address == "127.0.0.91"


@pytest.mark.parametrize(("typed", "hint"), [
    ("fe80::1%eth0", "fe80::1 is link-local and cannot be reached without a zone: give here's global or "
                     "unique-local IPv6 address (`ip -6 addr show scope global` on the host), its IPv4 address "
                     "or its DNS name: `ddtreectl set-ip here ADDRESS`"),
    ("2001:db8::5%bond0", "give the address without its zone: `ddtreectl set-ip here 2001:db8::5`"),
])
def test_a_scoped_ipv6_address_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], typed: str, hint: str
) -> None:
    """A zone index (`%eth0`) names an interface of the machine it was typed on; the inventory is read
    on others. set-ip used to write it (--no-verify; with a pinned key it then tried to connect
    through this machine's eth0). Now refused, whatever the flags, naming the file, the line of the
    host's address and what to type; the file is untouched."""
    root = project(tmp_path)
    before = (root / "hosts.yaml").read_bytes()
    for flags in (["--no-verify"], ["--no-verify", "--force", "--dry-run"], []):
        assert cli(root, "set-ip", "here", typed, *flags) == 3
        err = capsys.readouterr().err.splitlines()
        zone = typed.partition("%")[2]
        assert err[0] == (f"error: hosts.yaml:5: hosts.here.address: set-ip: {typed!r} carries a zone index "
                          f"(%{zone}), which names a network interface of the machine it is typed on; an "
                          "inventory is shared and read on other machines, where "
                          f"{zone} is another link or none. The inventory was not changed"), err
        assert err[-1] == f"hint: {hint}", err
        assert (root / "hosts.yaml").read_bytes() == before
    assert cli(root, "set-ip", "here", typed, "--no-verify", "--json") == 3
    doc = json.loads(capsys.readouterr().out)
    assert (doc["exit_code"], doc["error"]["hint"]) == (3, hint), doc
