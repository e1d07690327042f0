"""The real probe script under real /bin/sh, on this machine, through the local transport.

A fake `nvidia-smi` on PATH (a shell script) plays the cases no GPU machine here can: slow, broken,
absent. Everything else (systemctl, df, readlink, the release tree) is real.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from ddtreectl.inventory.models import Host
from ddtreectl.probes.status import load_script, parse_status_output, probe_status, status_command
from ddtreectl.transport.local import LocalTransport

from tests.probes.fixtures import FIXTURES


def _fake_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def local() -> LocalTransport:
    return LocalTransport(Host(name="local", address="127.0.0.1", transport="local"))


@pytest.fixture
def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bin dir in front of PATH, keeping only the real tools the script needs behind it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_release_tree_state_files_and_home_relative_root(
        local: LocalTransport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    root = tmp_path / "ddtree"
    (root / "releases" / "r1").mkdir(parents=True)
    (root / "releases" / "r2").mkdir()
    (root / "releases" / "r2" / ".build-stamp").write_text('{"engine": "abc123"}\n')
    (root / "current").symlink_to("releases/r2")
    (root / "state" / "lock").mkdir(parents=True)
    (root / "state" / "lock" / "owner.json").write_text('{"owner": "ana", "reason": "deploy"}')
    (root / "state" / "mode.json").write_text('{"mode": "dev"}')
    (root / "state" / "audit.log").write_text("not a status fact\n")
    facts = probe_status(local, unit=None, remote_root="~/ddtree", timeout=30)
    rel = facts.release
    assert (rel.root, rel.root_exists, rel.current, rel.build_stamp) == (str(root), True, "r2", True)
    assert rel.releases == ("r1", "r2") and rel.stamp_text == '{"engine": "abc123"}'
    assert dict(facts.state_files) == {"state/mode.json": '{"mode": "dev"}',
                                       "state/lock/owner.json": '{"owner": "ana", "reason": "deploy"}'}
    assert facts.service is None
    assert facts.disk is not None and facts.disk.total_kib > 0


def test_current_without_stamp_and_dangling_current(local: LocalTransport, tmp_path: Path) -> None:
    (tmp_path / "releases" / "r1").mkdir(parents=True)
    (tmp_path / "current").symlink_to("releases/r1")
    rel = probe_status(local, unit=None, remote_root=str(tmp_path), timeout=30).release
    assert (rel.current, rel.current_exists, rel.build_stamp) == ("r1", True, False)
    (tmp_path / "current").unlink()
    (tmp_path / "current").symlink_to("releases/gone")
    rel = probe_status(local, unit=None, remote_root=str(tmp_path), timeout=30).release
    assert (rel.current, rel.current_exists) == ("gone", False)


def test_fake_nvidia_smi_answers_like_a_serving_host(local: LocalTransport, fake_path: Path) -> None:
    gpus = FIXTURES / "nvidia-smi-gpus-rtxpro6000-8x-serving.txt"
    apps = FIXTURES / "nvidia-smi-apps-rtxpro6000-8x-serving.txt"
    _fake_tool(fake_path, "nvidia-smi", f"""case "$1" in
  --query-gpu=*) grep -v '^#' '{gpus}' ;;
  --query-compute-apps=*) grep -v '^#' '{apps}' ;;
  *) exit 2 ;;
esac
""")
    facts = probe_status(local, unit=None, remote_root="/nonexistent/ddtree", timeout=30)
    assert facts.gpus.status == "ok" and len(facts.gpus.gpus) == 8 and len(facts.gpus.apps) == 8
    # remote_root does not exist yet: free space is read on its nearest existing parent.
    assert facts.disk is not None and not facts.release.root_exists


def test_hanging_nvidia_smi_is_bounded_and_reported(local: LocalTransport, fake_path: Path) -> None:
    _fake_tool(fake_path, "nvidia-smi", f"touch {fake_path.parent}/nvidia-smi-called-$$\nexec sleep 30\n")
    facts = probe_status(local, unit=None, remote_root="/nonexistent", timeout=30, gpu_timeout_s=1)
    assert facts.gpus.status == "timeout"
    assert facts.disk is not None  # the sections after the hang still arrived
    # The compute-apps query is not run after a timeout (it would hang as long again).
    assert not facts.gpus.apps_known
    assert len(list((fake_path.parent).glob("nvidia-smi-called-*"))) == 1


def test_failing_nvidia_smi_reports_its_words(local: LocalTransport, fake_path: Path) -> None:
    _fake_tool(fake_path, "nvidia-smi", "echo 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    facts = probe_status(local, unit=None, remote_root="/nonexistent", timeout=30)
    assert (facts.gpus.status, facts.gpus.detail) == (
        "error", "Failed to initialize NVML: Driver/library version mismatch")


def test_no_nvidia_smi_and_no_systemctl(local: LocalTransport, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # PATH with only the basics: neither tool can be found (the script adds sbin dirs itself).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "cat", "cut", "uname", "id", "date", "df", "dirname", "readlink", "head", "wc"):
        os.symlink(f"/usr/bin/{tool}" if os.path.exists(f"/usr/bin/{tool}") else f"/bin/{tool}",
                   bin_dir / tool)
    command = status_command("x.service", "/nonexistent", 5).replace(
        "PATH=\"$PATH:/usr/sbin:/sbin:/usr/bin:/bin\"", f"PATH={bin_dir}")
    monkeypatch.setenv("PATH", str(bin_dir))
    result = local.run(command, timeout=30)
    facts = parse_status_output(result.stdout, unit="x.service")
    assert facts.gpus.status == "missing"
    assert facts.service is not None and facts.service.detail == "systemctl is not installed"


def test_unit_name_and_root_are_quoted_not_interpreted(local: LocalTransport, tmp_path: Path) -> None:
    evil = tmp_path / "x; touch pwned"
    facts = probe_status(local, unit="a.service; touch pwned2", remote_root=str(evil), timeout=30)
    assert facts.release.root == str(evil)
    assert not (tmp_path / "pwned").exists() and not Path("pwned2").exists()


@pytest.mark.parametrize("shell", ["dash", "bash", "busybox"])
def test_same_facts_under_every_sh(shell: str, tmp_path: Path) -> None:
    """`sh` is dash on Debian, bash on RHEL, busybox on small images: the facts must not differ."""
    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed")
    (tmp_path / "releases" / "r1").mkdir(parents=True)
    (tmp_path / "releases" / "r1" / ".build-stamp").write_text("ok\n")
    (tmp_path / "current").symlink_to("releases/r1")
    argv = [exe, "sh", "-c"] if shell == "busybox" else [exe, "-c"]
    out = subprocess.run([*argv, load_script("status.sh"), "ddtree-probe", "", str(tmp_path), "5"],
                         capture_output=True, text=True, timeout=60)
    assert out.stderr == ""
    facts = parse_status_output(out.stdout, unit=None)
    assert facts.machine_id == Path("/etc/machine-id").read_text().strip()
    assert (facts.release.current, facts.release.build_stamp, facts.release.stamp_text) == ("r1", True, "ok")
    assert facts.disk is not None and facts.uptime_s is not None and facts.kernel == os.uname().release


@pytest.mark.parametrize("shell", ["dash", "bash", "busybox"])
def test_sshd_listener_is_read_from_proc_net(shell: str, tmp_path: Path) -> None:
    """The port of $SSH_CONNECTION (the session's local port) with a LISTEN socket on it: sshd still
    accepts logins; none: it stopped (a client on an old master must not read that as reachable).
    Real sockets, real /proc/net/tcp{,6}, under every sh."""
    import socket

    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed")
    argv = [exe, "sh", "-c"] if shell == "busybox" else [exe, "-c"]

    def listening(env_value: str | None) -> bool | None:
        env = {k: v for k, v in os.environ.items() if k != "SSH_CONNECTION"}
        if env_value is not None:
            env["SSH_CONNECTION"] = env_value
        out = subprocess.run([*argv, load_script("status.sh"), "ddtree-probe", "", str(tmp_path), "5"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.stderr == ""
        return parse_status_output(out.stdout, unit=None).sshd_listening

    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            server = socket.socket(family, socket.SOCK_STREAM)
            server.bind((address, 0))
        except OSError:
            continue  # no IPv6 here
        with server:
            server.listen(1)
            port = server.getsockname()[1]
            assert listening(f"{address} 40000 {address} {port}") is True
        # Closed: nothing listens on that port any more (a connected socket on it would not count).
        assert listening(f"{address} 40000 {address} {port}") is False
    assert listening(None) is None  # not reached over SSH: not known
    assert listening("10.0.0.1 40000 10.0.0.2 not-a-port") is None


@pytest.mark.parametrize("shell", ["dash", "bash", "busybox"])
def test_an_active_unit_is_asked_whether_it_serves_yet(shell: str, tmp_path: Path) -> None:
    """systemd says "running" from the moment the server process starts; the model then loads with the
    port closed or /health answering 503. The probe reads the port's listener and asks /health once
    (a real HTTP server here; `systemctl` is a stand-in that says the unit is active)."""
    import http.server
    import socket
    import threading

    exe = shutil.which(shell)
    if exe is None:
        pytest.skip(f"{shell} is not installed")
    argv = [exe, "sh", "-c"] if shell == "busybox" else [exe, "-c"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    state = tmp_path / "active"
    state.write_text("active")
    _fake_tool(bin_dir, "systemctl", f"printf 'LoadState=loaded\\nActiveState=%s\\nSubState=running\\n"
                                     f"MainPID=0\\n' \"$(cat {state})\"\n")
    answer = {"code": 503}

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(answer["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    def health(port: int) -> object:
        env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
        out = subprocess.run([*argv, load_script("status.sh"), "ddtree-probe", "svc.service", str(tmp_path), "5",
                              str(port)], capture_output=True, text=True, timeout=60, env=env)
        assert out.stderr == ""
        return parse_status_output(out.stdout, unit="svc.service").health

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        loading = health(port)
        assert (loading.listening, loading.http_status, loading.asked, loading.serving) == (True, 503, True, False)
        answer["code"] = 200
        assert health(port).serving is True
        state.write_text("activating")  # not active: not asked at all
        assert health(port) is None
        state.write_text("active")
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as closed:  # a port nothing listens on: not serving, no GET sent
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    shut = health(free)
    assert (shut.listening, shut.asked, shut.serving) == (False, False, False)
