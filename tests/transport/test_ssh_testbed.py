"""The SSH transport and `trust` against REAL test hosts (systemd + sshd in namespaces).

Each behaviour of the issue's Transports part, end to end: pinned keys by NAME across an IP move,
refusals with fingerprints, jump hosts, a stopped sshd, HTTP through a direct-tcpip channel to a
server the host's systemd runs, rsync with the pinned OpenSSH command, and `ddtreectl trust`.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from ddtreectl.errors import ConnectError, ExitCode, HostKeyError
from ddtreectl.fleet import run_on_hosts
from ddtreectl.inventory import edit
from ddtreectl.inventory.loader import load
from ddtreectl.transport import connect
from ddtreectl.transport.hostkeys import PublicKey
from ddtreectl.transport.ssh import SshTransport, open_ssh

pytestmark = pytest.mark.testbed
Boot = Callable[..., list[Any]]


@pytest.fixture(scope="module")
def pair(testbed: Any) -> Iterator[list[Any]]:
    """Two hosts nobody mutates (commands, jump, HTTP, rsync, latency)."""
    hosts = testbed.boot(["tr-a", "tr-b"])
    yield hosts
    for host in hosts:
        testbed.shutdown(host)


def _regenerate(host: Any) -> str:
    """New host key; sshd re-execs on reload, so wait until port 22 shows a banner again."""
    key: str = host.regenerate_host_key()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host.address, 22), timeout=1) as sock:
                if sock.recv(8).startswith(b"SSH-"):
                    return key
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"{host.name}: sshd did not come back after the key change")


def _inv(testbed: Any, hosts: list[Any], path: Path, **kw: Any) -> Any:
    return load(testbed.inventory(hosts, path, **kw))


def test_run_on_a_real_host_with_its_pinned_key(testbed: Any, pair: list[Any], tmp_path: Path) -> None:
    a = pair[0]
    inv = _inv(testbed, pair, tmp_path / "hosts.yaml")
    with connect(inv.host("tr-a"), inv) as t:
        r = t.run("cat /etc/machine-id; hostname; exit 3")
        assert r.exit_code == 3 and r.stdout.split() == [a.machine_id, "tr-a"]
        lines: list[str] = []
        t.run("systemctl is-system-running; echo done", on_line=lines.append)
        assert lines == ["running", "done"]
        assert t.run("cat", stdin=b"via stdin").stdout == "via stdin"


def test_regenerated_key_is_refused_with_both_fingerprints(testbed: Any, boot_hosts: Boot,
                                                          tmp_path: Path) -> None:
    (h,) = boot_hosts(["tr-rekey"])
    inv = _inv(testbed, [h], tmp_path / "hosts.yaml")
    old = PublicKey.parse(h.host_key)
    new = PublicKey.parse(_regenerate(h))
    with pytest.raises(HostKeyError) as err:
        connect(inv.host("tr-rekey"), inv)
    assert err.value.exit_code == ExitCode.CONNECTION
    assert old.fingerprint in err.value.message and new.fingerprint in err.value.message
    assert f"{h.address}:22" in err.value.message and "--replace" in (err.value.hint or "")


def test_unknown_key_is_refused_with_fingerprint_and_trust_hint(testbed: Any, pair: list[Any],
                                                                tmp_path: Path) -> None:
    inv = _inv(testbed, pair, tmp_path / "hosts.yaml", pin_keys=False)
    with pytest.raises(HostKeyError) as err:
        connect(inv.host("tr-b"), inv)
    assert PublicKey.parse(pair[1].host_key).fingerprint in err.value.message
    assert "ddtreectl trust tr-b" in (err.value.hint or "")


def test_address_move_keeps_trust_by_name(testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (h,) = boot_hosts(["tr-move"])
    path = testbed.inventory([h], tmp_path / "hosts.yaml", host_overrides={"tr-move": {"connect_timeout": 1.5}})
    old_address = h.address
    new_address = testbed.new_address()
    h.move_address(new_address)
    # What `set-ip` does: one surgical edit of the address; the pinned key stays with the NAME.
    edit.write_atomic(path, edit.edit_host(edit.read_text(path), path, "tr-move", {"address": new_address}))
    inv = load(path)
    with connect(inv.host("tr-move"), inv) as t:
        assert t.run("cat /etc/machine-id").stdout.strip() == h.machine_id
    stale = load(testbed.inventory([h], tmp_path / "stale.yaml",
                                   host_overrides={"tr-move": {"address": old_address, "connect_timeout": 1.5}}))
    t0 = time.monotonic()
    with pytest.raises(ConnectError) as err:
        connect(stale.host("tr-move"), stale)
    assert time.monotonic() - t0 < 10  # bounded by connect_timeout, not the OS's minutes
    assert "timed out" in err.value.message and old_address in err.value.message
    assert "`ddtreectl set-ip tr-move ADDRESS`" in (err.value.hint or "")  # named: ready to complete


def test_jump_host_reaches_b_through_a(testbed: Any, pair: list[Any], tmp_path: Path) -> None:
    a, b = pair
    inv = _inv(testbed, pair, tmp_path / "hosts.yaml", host_overrides={"tr-b": {"jump_host": "tr-a"}})
    with connect(inv.host("tr-b"), inv) as t:
        assert isinstance(t, SshTransport)
        # B's sshd sees the connection coming from A's address: it really went through A.
        assert t.run("echo $SSH_CONNECTION").stdout.split()[0] == a.address
        assert t.run("hostname").stdout.strip() == "tr-b"
        src = tmp_path / "payload"
        src.write_bytes(os.urandom(50_000))
        subprocess.run(["rsync", "-a", "-e", shlex.join(t.rsync_ssh_command()), str(src),
                        t.rsync_destination("/tmp/payload-via-jump")], check=True, timeout=60)
        assert (b.root / "tmp/payload-via-jump").read_bytes() == src.read_bytes()
    # The jump host's own pin is enforced: a wrong key for A refuses B's connection too.
    wrong = {"tr-a": {"host_key": b.host_key}, "tr-b": {"jump_host": "tr-a"}}
    bad = _inv(testbed, pair, tmp_path / "bad.yaml", host_overrides=wrong)
    with pytest.raises(HostKeyError) as err:
        connect(bad.host("tr-b"), bad)
    assert err.value.host == "tr-a"


def test_jump_to_a_dead_target_blames_the_target(testbed: Any, pair: list[Any], tmp_path: Path) -> None:
    a, b = pair
    nowhere = testbed.new_address()  # nothing there: packets are dropped, connects time out
    overrides = {"tr-b": {"jump_host": "tr-a", "address": nowhere, "connect_timeout": 1.5}}
    inv = _inv(testbed, pair, tmp_path / "hosts.yaml", host_overrides=overrides)
    with pytest.raises(ConnectError) as err:
        connect(inv.host("tr-b"), inv)
    assert err.value.host == "tr-b" and "no answer" in err.value.message
    assert f"{nowhere}:22 via tr-a" in err.value.message
    overrides["tr-b"].update(address=b.address, port=2)  # B is up, nothing listens on port 2
    inv = _inv(testbed, pair, tmp_path / "refused.yaml", host_overrides=overrides)
    with pytest.raises(ConnectError) as err:
        connect(inv.host("tr-b"), inv)
    assert err.value.host == "tr-b" and "could not open a TCP connection" in err.value.message


def test_stopped_sshd_is_a_quick_connect_error(testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (h,) = boot_hosts(["tr-nossh"])
    inv = _inv(testbed, [h], tmp_path / "hosts.yaml")
    h.stop_sshd()
    t0 = time.monotonic()
    with pytest.raises(ConnectError) as err:
        connect(inv.host("tr-nossh"), inv)
    assert time.monotonic() - t0 < 3  # refused at once (connect_timeout is 5 s)
    assert "connection refused" in err.value.message and h.address in err.value.message
    assert not isinstance(err.value, HostKeyError)


def test_http_get_through_the_ssh_channel(testbed: Any, pair: list[Any], tmp_path: Path) -> None:
    a = pair[0]
    a.write_file("/srv/www/health", "alive\n")
    a.sh("systemd-run --unit=tr-http --property=WorkingDirectory=/srv/www "
         "/usr/bin/python3 -m http.server 18080 --bind 127.0.0.1")
    try:
        inv = _inv(testbed, pair, tmp_path / "hosts.yaml")
        with connect(inv.host("tr-a"), inv) as t:
            deadline = time.monotonic() + 20
            while not t.port_open(18080, timeout=2) and time.monotonic() < deadline:
                time.sleep(0.1)
            resp = t.http_get(18080, "/health", timeout=5)
            assert (resp.status, resp.body) == (200, b"alive\n")
            assert t.http_get(18080, "/missing", timeout=5).status == 404
            # Only the host's loopback serves it: the runner cannot reach that port directly.
            assert subprocess.run(["python3", "-c", f"import socket; socket.create_connection(('{a.address}', 18080), 2)"],
                                  capture_output=True).returncode != 0
    finally:
        a.systemctl("stop", "tr-http", check=False)


def test_rsync_to_a_host_with_the_pinned_command(testbed: Any, pair: list[Any], tmp_path: Path) -> None:
    a = pair[0]
    src = tmp_path / "release"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "engine").write_bytes(os.urandom(200_000))
    (src / "README").write_text("release\n")
    inv = _inv(testbed, pair, tmp_path / "hosts.yaml")
    with connect(inv.host("tr-a"), inv) as t:
        argv = t.rsync_ssh_command()
        assert argv is not None
        assert t.run("mkdir -p /opt/ddtree/releases").ok
        subprocess.run(["rsync", "-a", "--delete", "-e", shlex.join(argv), f"{src}/",
                        t.rsync_destination("/opt/ddtree/releases/r1/")], check=True, timeout=60)
        assert t.run("sha256sum /opt/ddtree/releases/r1/bin/engine").stdout.split()[0] == \
            subprocess.run(["sha256sum", str(src / "bin/engine")], capture_output=True,
                           text=True).stdout.split()[0]


def test_ddtreectl_trust_records_the_key_then_commands_work(testbed: Any, boot_hosts: Boot,
                                                            tmp_path: Path) -> None:
    (h,) = boot_hosts(["tr-trust"])
    path = testbed.inventory([h], tmp_path / "hosts.yaml", pin_keys=False,
                             host_overrides={"tr-trust": {"machine_id": None}})
    with pytest.raises(HostKeyError):
        connect(load(path).host("tr-trust"))
    cli = [sys.executable, "-m", "ddtreectl.cli.main"] if not _installed() else ["ddtreectl"]
    out = subprocess.run(cli + ["-i", str(path), "trust", "tr-trust", "--yes"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert PublicKey.parse(h.host_key).fingerprint in out.stdout
    host = load(path).host("tr-trust")
    assert host.host_key == h.host_key and host.machine_id == h.machine_id and host.gpu_uuids == ()
    with connect(host) as t:
        assert t.run("hostname").stdout.strip() == "tr-trust"
    # The host is reinstalled: trust refuses without --replace, exit 4, both fingerprints.
    old = h.host_key
    new = _regenerate(h)
    out = subprocess.run(cli + ["-i", str(path), "trust", "tr-trust", "--yes"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 4
    assert PublicKey.parse(new).fingerprint in out.stderr and PublicKey.parse(old).fingerprint in out.stderr
    assert load(path).host("tr-trust").host_key == old  # nothing recorded


def _installed() -> bool:
    import shutil

    return shutil.which("ddtreectl") is not None


def test_login_shell_rc_runs_for_every_exec(testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    """Measured fact behind ssh.py's wrapping: bash sources ~/.bashrc for each non-interactive exec."""
    (h,) = boot_hosts(["tr-rc"])
    inv = _inv(testbed, [h], tmp_path / "hosts.yaml")
    h.write_file("/root/.bashrc", "echo rc-was-sourced >&2\nexport FROM_RC=yes\n")
    with connect(inv.host("tr-rc"), inv) as t:
        r = t.run("echo ${FROM_RC-no}; echo $0")
        assert r.stdout.split() == ["yes", "/bin/sh"]  # rc ran first, then our POSIX sh
        assert "rc-was-sourced" in r.stderr
        clean = min(t.run("true").duration_s for _ in range(5))
        h.write_file("/root/.bashrc", "sleep 0.1\n")
        heavy = min(t.run("true").duration_s for _ in range(5))
    print(f"\nwarm exec on a test host: clean rc {clean * 1e3:.1f} ms, rc with `sleep 0.1` "
          f"{heavy * 1e3:.1f} ms")


def test_latency_connect_and_warm_exec(testbed: Any, pair: list[Any], tmp_path: Path) -> None:
    """Prints (never asserts) connect and warm-exec latency with and without TCP_NODELAY."""
    inv = _inv(testbed, pair, tmp_path / "hosts.yaml")
    host = inv.host("tr-a")
    rows = []
    for nodelay in (True, False):
        connects = []
        for _ in range(3):
            t0 = time.monotonic()
            t = open_ssh(host, nodelay=nodelay)
            connects.append(time.monotonic() - t0)
            t.close()
        with open_ssh(host, nodelay=nodelay) as t:
            t.run("true")
            execs = sorted(t.run("true").duration_s for _ in range(20))
        rows.append((nodelay, min(connects), execs[len(execs) // 2]))
    print()
    for nodelay, c, e in rows:
        print(f"test host, TCP_NODELAY={nodelay!s:5}: connect+auth {c * 1e3:6.1f} ms, "
              f"warm exec median {e * 1e3:6.1f} ms")
    print(f"warm exec without/with TCP_NODELAY: {rows[1][2] / rows[0][2]:.1f}x")


def test_fleet_over_real_hosts_one_deadline(testbed: Any, boot_hosts: Boot, pair: list[Any],
                                            tmp_path: Path) -> None:
    """A refused host and a timing-out (moved) host never hold up the healthy ones."""
    (gone,) = boot_hosts(["tr-gone"])
    old = gone.address
    gone.move_address(testbed.new_address())  # old address now times out
    overrides = {"tr-gone": {"address": old, "connect_timeout": 20}}
    inv = _inv(testbed, [*pair, gone], tmp_path / "hosts.yaml", host_overrides=overrides)

    def probe(host: Any) -> str:
        with connect(host, inv) as t:
            return t.run("hostname").stdout.strip()

    t0 = time.monotonic()
    result = run_on_hosts(list(inv.hosts.values()), probe, deadline_s=3)
    elapsed = time.monotonic() - t0
    assert [r.value for r in result.ok] == ["tr-a", "tr-b"]
    assert result["tr-gone"].timed_out  # its 20 s connect timeout was cut by the 3 s deadline
    assert elapsed < 15
    assert result.exit_code() == ExitCode.PARTIAL


GPU_UUIDS = ("GPU-5a3c9d1e-7b2f-4c8a-9e61-0d4f3b2a1c90", "GPU-e8b1f2c3-4d5e-6f70-8192-a3b4c5d6e7f8")
# Stands in for nvidia-smi on a GPU-less test host: answers the one query trust makes, as the
# real tool prints it (one UUID per line, no header), and fails on anything else.
NVIDIA_SMI_STUB = f"""#!/bin/sh
case "$*" in
  *--query-gpu=uuid*--format=csv,noheader*) printf '%s\\n' {' '.join(GPU_UUIDS)} ;;
  *) echo "stub: unexpected arguments: $*" >&2; exit 9 ;;
esac
"""


def test_trust_records_gpu_uuids(testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    (h,) = boot_hosts(["tr-gpu"], gpus_stub={"tr-gpu": NVIDIA_SMI_STUB})
    path = testbed.inventory([h], tmp_path / "hosts.yaml", pin_keys=False,
                             host_overrides={"tr-gpu": {"machine_id": None, "gpus": 2}})
    cli = ["ddtreectl"] if _installed() else [sys.executable, "-m", "ddtreectl.cli.main"]
    out = subprocess.run(cli + ["-i", str(path), "trust", "tr-gpu", "-y"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "2 GPU UUID(s)" in out.stdout
    host = load(path).host("tr-gpu")
    assert host.gpu_uuids == GPU_UUIDS and host.machine_id == h.machine_id


def test_trust_refuses_changed_gpu_uuids_unless_replace_and_says_what_it_replaced(
        testbed: Any, boot_hosts: Boot, tmp_path: Path) -> None:
    """A GPU swap (same machine-id, same key, other GPU UUIDs) was recorded silently by a plain
    `trust`: the record set-ip checks identity against changed with no word. GPU UUIDs are identity
    like the machine-id (ops notes: they "catch a swapped box"), so it is refused the same way (exit
    4) and --replace records it, saying what it replaced, in text and --json."""
    import json

    (h,) = boot_hosts(["tr-swap"], gpus_stub={"tr-swap": NVIDIA_SMI_STUB})
    old = "GPU-00c0ffee-1111-4222-8333-944445555666"
    path = testbed.inventory([h], tmp_path / "hosts.yaml",
                             host_overrides={"tr-swap": {"gpus": 2, "gpu_uuids": [GPU_UUIDS[0], old]}})
    before = path.read_text()
    cli = ["ddtreectl"] if _installed() else [sys.executable, "-m", "ddtreectl.cli.main"]

    def trust(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cli + ["-i", str(path), "trust", "tr-swap", *args], capture_output=True, text=True,
                              timeout=60)

    refused = trust("-y")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "GPU UUIDs differ from the recorded ones" in refused.stderr, refused.stderr
    assert f"1 recorded no longer present ({old}); 1 new ({GPU_UUIDS[1]})" in refused.stderr, refused.stderr
    assert "`ddtreectl trust tr-swap --replace`" in refused.stderr
    assert path.read_text() == before
    doc = json.loads(trust("-y", "--json").stdout)
    assert (doc["schema"], doc["ok"], doc["exit_code"], doc["host"]) == ("ddtreectl.trust/1", False, 4, "tr-swap")
    assert GPU_UUIDS[1] in doc["error"]["message"] and "--replace" in doc["error"]["hint"], doc
    assert path.read_text() == before

    replaced = trust("-y", "--replace", "--json")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    doc = json.loads(replaced.stdout)
    assert (doc["ok"], doc["changed"], doc["gpu_uuids"]) == (True, True, list(GPU_UUIDS)), doc
    assert doc["replaced"] == {"key_fingerprint": None, "machine_id": None,
                               "gpu_uuids": {"removed": [old], "added": [GPU_UUIDS[1]]}}, doc
    assert load(path).host("tr-swap").gpu_uuids == GPU_UUIDS
    # Now recorded: a plain trust agrees and replaces nothing.
    again = trust("-y")
    assert again.returncode == 0 and "already trusted" in again.stdout and "REPLACED" not in again.stderr, again

    # The text form of a --replace says it loudly on stderr.
    path.write_text(before)
    text = trust("-y", "--replace")
    assert text.returncode == 0, text.stdout + text.stderr
    assert f"tr-swap: REPLACED GPU UUIDs: 1 recorded no longer present ({old}); 1 new ({GPU_UUIDS[1]})" \
        in text.stderr, text.stderr
    assert "2 GPU UUID(s)" in text.stdout
