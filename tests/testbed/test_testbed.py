"""The test-host fleet itself: real sshd, systemd, addresses, teardown, and the cgroup safety check."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.testbed import BootError, Fleet, TestHost
from tests.testbed.fleet import HOST_INIT
from tests.testbed.layout import Slot, SlotLock
from tests.testbed.resources import kill_cgroup, remove_cgroup_tree, slot_links

pytestmark = pytest.mark.testbed
BootHosts = Callable[..., list[TestHost]]
REPO = Path(__file__).resolve().parents[2]


def tcp_answers(address: str, timeout: float = 1.5) -> str:
    """'banner' / 'refused' / 'timeout' / 'unreachable' for port 22 of `address`."""
    try:
        with socket.create_connection((address, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return "banner" if sock.recv(64).startswith(b"SSH-") else "other"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError:
        return "unreachable"


@pytest.fixture(scope="module")
def trio(testbed: Fleet) -> Iterator[list[TestHost]]:
    hosts = testbed.boot(["tb-a", "tb-b", "tb-c"])
    yield hosts
    for host in hosts:
        testbed.shutdown(host)


def test_ssh_with_pinned_key_reaches_distinct_hosts(testbed: Fleet, trio: list[TestHost]) -> None:
    seen = {}
    for host in trio:
        out = testbed.ssh(host, "hostname; cat /etc/machine-id; python3 -c 'print(6*7)'; rsync --version | head -1")
        assert out.returncode == 0, out.stderr
        hostname, machine_id, py, rsync_line = out.stdout.splitlines()
        assert hostname == host.name
        assert machine_id == host.machine_id
        assert py == "42" and rsync_line.startswith("rsync")
        seen[hostname] = machine_id
    assert len(set(seen.values())) == 3
    assert len({h.host_key for h in trio}) == 3
    # what hosts send beyond the bridge is never forwarded (they must not reach real machines)
    assert Path(f"/proc/sys/net/ipv4/conf/{testbed.slot.bridge}/forwarding").read_text().strip() == "0"


def test_ssh_refuses_a_wrong_pinned_key(testbed: Fleet, trio: list[TestHost]) -> None:
    out = testbed.ssh(trio[0], "true", pinned_key=trio[1].host_key)
    assert out.returncode == 255
    assert "Host key verification failed" in out.stderr


def test_rsync_over_ssh(testbed: Fleet, trio: list[TestHost], tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.bin").write_bytes(os.urandom(100_000))
    rsh = " ".join(testbed.ssh_argv(trio[0])[:-1])  # without the trailing root@ADDRESS
    out = subprocess.run(["rsync", "-a", "-e", rsh, f"{src}/", f"root@{trio[0].address}:/opt/rsync-probe/"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (trio[0].root / "opt/rsync-probe/sub/data.bin").read_bytes() == (src / "sub" / "data.bin").read_bytes()
    assert not Path("/opt/rsync-probe").exists()  # went into the host's overlay, not the runner


def test_systemd_runs_and_transient_unit_logs(trio: list[TestHost]) -> None:
    host = trio[1]
    assert host.systemctl("is-system-running").stdout.strip() == "running"
    marker = f"marker-{uuid.uuid4().hex}"
    unit = f"tb-probe-{uuid.uuid4().hex[:8]}"
    host.sh(f"systemd-run --wait --unit {unit} /bin/sh -c 'echo {marker}'")
    assert marker in host.journal(unit)
    assert marker in host.sh(f"journalctl --no-pager -u {unit}").stdout
    assert host.systemctl("show", "-p", "Result", "--value", unit, check=False).stdout.strip() in ("success", "")


def test_files_and_nvidia_smi_stub(testbed: Fleet, trio: list[TestHost]) -> None:
    host = trio[2]
    host.write_file("/etc/ddtree-probe.conf", "hello\n", 0o600)
    assert host.sh("stat -c %a /etc/ddtree-probe.conf && cat /etc/ddtree-probe.conf").stdout == "600\nhello\n"
    assert not Path("/etc/ddtree-probe.conf").exists()
    host.install_nvidia_smi_stub("#!/bin/sh\necho 'stub 0, GPU-FAKE'\n")
    out = testbed.ssh(host, "nvidia-smi")
    assert out.stdout.strip() == "stub 0, GPU-FAKE", out.stderr


def test_move_address_keeps_host_key(testbed: Fleet, boot_hosts: BootHosts) -> None:
    (host,) = boot_hosts(["tb-mover"])
    old, key = host.address, host.host_key
    new = testbed.new_address()
    host.move_address(new)
    assert host.address == new
    out = testbed.ssh(host, "hostname")
    assert out.returncode == 0 and out.stdout.strip() == "tb-mover", out.stderr
    assert host.host_key == key
    assert tcp_answers(old) in ("timeout", "unreachable")  # nobody answers, not even with a refusal


def test_stop_sshd_only_silences_that_host(trio: list[TestHost]) -> None:
    host, other = trio[0], trio[1]
    host.stop_sshd()
    try:
        assert tcp_answers(host.address) == "refused"
        assert tcp_answers(other.address) == "banner"
        assert host.systemctl("is-active", "ssh.service", check=False).stdout.strip() == "inactive"
    finally:
        host.start_sshd()
    assert tcp_answers(host.address) == "banner"


def test_regenerate_host_key(testbed: Fleet, boot_hosts: BootHosts) -> None:
    (host,) = boot_hosts(["tb-rekey"])
    old = host.host_key
    new = host.regenerate_host_key()
    assert new != old and new.startswith("ssh-ed25519 ") and host.host_key == new
    assert testbed.ssh(host, "true", pinned_key=old).returncode == 255
    assert testbed.ssh(host, "true", pinned_key=new).returncode == 0


def test_gpus_stub_at_boot_and_inventory(testbed: Fleet, boot_hosts: BootHosts, tmp_path: Path) -> None:
    from dataclasses import fields

    from ddtreectl.inventory.loader import load
    from ddtreectl.inventory.models import Host

    hosts = boot_hosts(["tb-inv1", "tb-inv2"], gpus_stub={"tb-inv2": "#!/bin/sh\necho stubbed\n"})
    assert hosts[1].sh("nvidia-smi").stdout == "stubbed\n"
    assert hosts[0].sh("command -v nvidia-smi || echo none").stdout.strip() in ("none", "/usr/bin/nvidia-smi")
    path = testbed.inventory(hosts, tmp_path / "hosts.yaml", groups={"dev": ["tb-inv1", "tb-inv2"]},
                             host_overrides={"tb-inv2": {"gpus": 1}})
    doc = yaml.safe_load(path.read_text())
    entry = doc["hosts"]["tb-inv1"]
    assert entry["address"] == hosts[0].address and entry["host_key"] == hosts[0].host_key
    assert entry["identity_file"] == str(testbed.client_key) and entry["machine_id"] == hosts[0].machine_id
    assert doc["hosts"]["tb-inv2"]["gpus"] == 1 and doc["groups"] == {"dev": ["tb-inv1", "tb-inv2"]}
    assert set(entry) <= {f.name for f in fields(Host)}
    loaded = load(path)  # the real inventory loader accepts what the fixture writes
    assert loaded.host("tb-inv1").host_key == hosts[0].host_key
    assert loaded.host("tb-inv2").gpus == 1 and loaded.host("tb-inv1").address == hosts[0].address
    unpinned = yaml.safe_load(testbed.inventory(hosts, tmp_path / "u.yaml", pin_keys=False).read_text())
    assert unpinned["hosts"]["tb-inv1"]["host_key"] is None


def _alive(pid: int, wait: float = 10) -> bool:
    """Whether `pid` still runs after up to `wait` s (a zombie awaiting its reaper counts as dead)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        if state == "Z":
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


def test_degraded_boot_fails_naming_the_unit(testbed: Fleet) -> None:
    unit = "[Unit]\nDescription=always fails\n[Service]\nType=oneshot\nExecStart=/bin/false\n"
    files: dict[str, dict[str, str | bytes]] = {"tb-bad": {"/etc/systemd/system/tb-broken.service": unit,
                        "/etc/systemd/system/multi-user.target.d/tb-broken.conf": "[Unit]\nWants=tb-broken.service\n"}}
    with pytest.raises(BootError) as err:
        testbed.boot(["tb-bad"], files=files)
    assert "'degraded'" in str(err.value) and "tb-broken.service" in str(err.value)
    assert "tb-bad" not in testbed.hosts and not (testbed.slot.cgroup / "tb-bad").exists()


def _leftovers(slot: Slot) -> list[str]:
    found = [f"link {n}" for n in slot_links(slot)]
    if slot.cgroup.exists():
        found.append(str(slot.cgroup))
    if slot.workdir.exists():
        found.append(str(slot.workdir))
    return found


def test_teardown_leaves_nothing(testbed: Fleet) -> None:
    with Fleet() as fleet:  # a second slot, beside the session's
        assert fleet.slot.number != testbed.slot.number
        hosts = fleet.boot(["td-1", "td-2"])
        pids = [h.init_pid for h in hosts]
        slot = fleet.slot
        assert len(slot_links(slot)) == 3  # bridge + 2 veths
        fleet.shutdown(hosts[0])
        assert not hosts[0].cgroup.exists() and not _alive(pids[0])
        assert len(slot_links(slot)) == 2
    assert _leftovers(slot) == []
    assert not any(_alive(pid) for pid in pids)


CRASHER = textwrap.dedent("""
    import sys, time
    from tests.testbed import Fleet
    fleet = Fleet()
    (host,) = fleet.boot(["crash-1"])
    print(fleet.slot.number, host.init_pid, flush=True)
    time.sleep(600)
""")


def test_killed_runner_takes_its_hosts_along_and_cleanup_removes_the_rest(testbed: Fleet) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CRASHER], cwd=REPO, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, "crasher did not boot its host"
        number, pid = map(int, line.split())
        slot = Slot(number, testbed.slot.cgroup_root)
        assert Path(f"/proc/{pid}").exists()
    finally:
        proc.send_signal(signal.SIGKILL)  # no teardown runs: layer 1 (pdeathsig) must act alone
        proc.wait()
    assert not _alive(pid), "host PID 1 survived its runner"
    # Layer 3. Its lock died with the runner; a parallel pytest run may take the slot any moment
    # (pre-cleaning it itself), so look at the slot only while holding its lock.
    with _holding(number) as held:
        if not held:
            pytest.skip(f"another run took slot {number} before the leftovers could be checked")
        assert _leftovers(slot)  # bridge, cgroup dirs and work dir are still there ...
    out = subprocess.run([sys.executable, "-m", "tests.testbed.cleanup"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert f"slot {testbed.slot.number} is in use, skipped" in out.stdout  # live fleets are left alone
    assert testbed.slot.bridge in slot_links(testbed.slot)
    assert f"slot {number}: removed" in out.stdout or f"slot {number} is in use" in out.stdout, out.stdout
    with _holding(number) as held:
        if held:
            assert _leftovers(slot) == []  # ... until cleanup


@contextlib.contextmanager
def _holding(number: int) -> Iterator[bool]:
    lock = SlotLock(number)
    held = lock.try_acquire()
    try:
        yield held
    finally:
        lock.release()


PURE_V2 = textwrap.dedent("""
    import socket
    from tests.testbed import Fleet
    with Fleet() as fleet:
        (host,) = fleet.boot(["v2-1"])
        banner = socket.create_connection((host.address, 22), timeout=5).recv(64)
        print(fleet.slot.cgroup_root, host.cgroup, host.systemctl("is-system-running").stdout.strip(),
              banner[:4].decode(), flush=True)
""")


def test_pure_cgroup2_layout(testbed: Fleet) -> None:
    """This machine is hybrid; in a mount namespace with cgroup2 on /sys/fs/cgroup (as on pure v2)."""
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
         'mount -t cgroup2 cgroup2 /sys/fs/cgroup && exec "$0" -c "$1"', sys.executable, PURE_V2],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    root, cgroup, state, banner = out.stdout.split()
    assert root == "/sys/fs/cgroup" and cgroup.startswith("/sys/fs/cgroup/ddtreectl-testbed/slot")
    assert state == "running" and banner == "SSH-"


# --- the SAFETY check of host-init (systemd is never started by these tests) -------------------

def _run_init(launch: str, cgroup: Path, want: Path, mode: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run host-init.sh from cgroup `cgroup` through `launch` (an unshare command line or '')."""
    # A hostdir without the "go" FIFO: had a check wrongly passed in boot mode, the script would
    # stop at reading it (exit 2), never reaching any mount or systemd.
    hostdir = tmp_path / "no-such-hostdir"
    script = f'echo $$ > {cgroup}/cgroup.procs && exec {launch} {HOST_INIT} {hostdir} safety {want} {mode}'
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)


@pytest.fixture
def safety_cgroups(testbed: Fleet) -> Iterator[tuple[Path, Path]]:
    right, wrong = testbed.slot.cgroup / "safety-right", testbed.slot.cgroup / "safety-wrong"
    for cg in (right, wrong):
        cg.mkdir()
    yield right, wrong
    for cg in (right, wrong):
        kill_cgroup(cg)
        remove_cgroup_tree(cg)


FULL_NS = "unshare --net --mount --pid --fork --kill-child=SIGKILL --cgroup --uts --ipc --propagation private --"


def test_host_init_safety_check_passes_only_in_its_child_cgroup(safety_cgroups: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    right, wrong = safety_cgroups
    ok = _run_init(FULL_NS, right, right, "check", tmp_path)
    assert ok.returncode == 0 and "safety checks passed" in ok.stdout, ok.stderr

    cases = {
        "launched from another cgroup": (FULL_NS, wrong, right, "PID 1 is not a member"),
        "no cgroup namespace": (FULL_NS.replace("--cgroup ", ""), right, right, "not in a cgroup namespace"),
        "no PID namespace": ("", right, right, "not PID 1"),
        "cgroup2 root as target": (FULL_NS, right, _cgroup2_root(right), "not a child cgroup"),
    }
    for what, (launch, cgroup, want, message) in cases.items():
        out = _run_init(launch, cgroup, want, "boot", tmp_path)
        assert out.returncode == 111, f"{what}: rc {out.returncode} {out.stderr}"
        assert "REFUSING TO BOOT" in out.stderr and message in out.stderr, f"{what}: {out.stderr}"


def _cgroup2_root(cgroup: Path) -> Path:
    from tests.testbed.layout import cgroup2_mount

    root = cgroup2_mount()
    assert root is not None and root in cgroup.parents
    return root


def test_boot_times(testbed: Fleet, capsys: pytest.CaptureFixture[str]) -> None:
    """Measured and printed for the record, never asserted."""
    results = []
    for count in (4, 8):
        names = [f"tm{count}-{i}" for i in range(count)]
        start = time.monotonic()
        hosts = testbed.boot(names)
        elapsed = time.monotonic() - start
        for host in hosts:
            testbed.shutdown(host)
        results.append(f"{count} hosts: {elapsed:.2f} s")
    with capsys.disabled():
        print("\ntestbed boot (ssh banner + systemd running): " + "; ".join(results))


@pytest.mark.testbed
def test_reboot_keeps_the_disk_and_starts_enabled_units(testbed: Fleet, boot_hosts: Callable[..., list[TestHost]]) -> None:
    (host,) = boot_hosts(["tb-reboot"])
    host.write_file("/etc/systemd/system/tb-sleeper.service",
                    "[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n")
    host.systemctl("enable", "--now", "tb-sleeper.service")
    host.sh("echo gone > /run/tb-marker && echo kept > /var/lib/tb-marker")
    old_pid = host.init_pid
    key, machine_id, address = host.host_key, host.machine_id, host.address
    testbed.reboot(host)
    assert host.init_pid != old_pid
    assert host.systemctl("is-active", "tb-sleeper.service", check=False).stdout.strip() == "active"
    assert host.sh("cat /var/lib/tb-marker").stdout.strip() == "kept"
    assert host.sh("test -e /run/tb-marker", check=False).returncode != 0
    assert (host.host_key, host.machine_id, host.address) == (key, machine_id, address)
    assert testbed.ssh(host, "hostname").stdout.strip() == "tb-reboot"
