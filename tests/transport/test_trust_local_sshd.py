"""`ddtreectl trust` end to end against a throwaway sshd: the CLI, the inventory edit, the pin."""

from __future__ import annotations

import io
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Callable

import pytest

from ddtreectl.cli.app import OPTIONS
from ddtreectl.cli.main import run
from ddtreectl.inventory.loader import load
from ddtreectl.operations.trust import gpu_query_status, parse_identity
from ddtreectl.transport import connect
from ddtreectl.transport.hostkeys import PublicKey

from tests.transport.sshd import LocalSshd, keygen

Start = Callable[..., LocalSshd]


def _inventory(path: Path, sshd: LocalSshd, host_key: str | None = None) -> Path:
    key = f"'{host_key}'" if host_key else "null"
    path.write_text(
        "# comment kept by the edit\n"
        "hosts:\n"
        "  box:\n"
        "    address: 127.0.0.1\n"
        f"    port: {sshd.port}\n"
        f"    identity_file: {sshd.client_key}\n"
        "    connect_timeout: 3\n"
        f"    host_key: {key}  # pinned by trust\n"
    )
    return path


def _cli(argv: list[str], stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = run(argv)
    finally:
        sys.stdin = old_stdin
        OPTIONS.inventory = None
    return code, out.getvalue(), err.getvalue()


def test_trust_yes_records_key_and_identity_then_commands_work(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd)
    fp = PublicKey.parse(sshd.host_key).fingerprint

    code, out, err = _cli(["-i", str(inv_path), "trust", "box", "--yes"])
    assert code == 0, err
    assert fp in out and "pinned" in out
    text = inv_path.read_text()
    assert text.startswith("# comment kept by the edit\n") and "# pinned by trust" in text
    host = load(inv_path).host("box")
    assert host.host_key is not None and PublicKey.parse(host.host_key).line == sshd.host_key
    machine_id = Path("/etc/machine-id").read_text().strip()  # the sshd runs on this machine
    assert host.machine_id == machine_id
    with connect(host) as t:
        assert t.run("echo ok").stdout == "ok\n"
    code, out, _ = _cli(["-i", str(inv_path), "trust", "box"])
    assert code == 0 and "already trusted" in out


def test_trust_asks_and_declining_records_nothing(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd)
    before = inv_path.read_text()
    code, out, err = _cli(["-i", str(inv_path), "trust", "box"], stdin="n\n")
    assert code == 4 and "NOT trusted" in err
    assert PublicKey.parse(sshd.host_key).fingerprint in out and "Trust this key" in out
    assert inv_path.read_text() == before
    code, out, err = _cli(["-i", str(inv_path), "trust", "box"], stdin="y\n")
    assert code == 0, err
    assert load(inv_path).host("box").host_key is not None


def test_trust_refuses_a_different_pinned_key_unless_replace(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    old = keygen(tmp_path / "old")
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd, host_key=old)
    code, _, err = _cli(["-i", str(inv_path), "trust", "box", "--yes"])
    assert code == 4
    assert PublicKey.parse(old).fingerprint in err and PublicKey.parse(sshd.host_key).fingerprint in err
    assert "--replace" in err
    assert old in inv_path.read_text()
    code, out, err = _cli(["-i", str(inv_path), "trust", "box", "--yes", "--replace"])
    assert code == 0, err
    assert "REPLACING" in out
    assert load(inv_path).host("box").host_key == sshd.host_key


def test_trust_replace_sees_a_host_that_no_longer_offers_the_pinned_key_type(
    start_sshd: Start, tmp_path: Path
) -> None:
    sshd = start_sshd()  # ed25519 only
    old_rsa = keygen(tmp_path / "old", "rsa")
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd, host_key=old_rsa)
    code, out, err = _cli(["-i", str(inv_path), "trust", "box", "--yes", "--replace"])
    assert code == 0, err
    assert load(inv_path).host("box").host_key == sshd.host_key


def test_parse_identity_tolerates_rc_noise_and_missing_gpus() -> None:
    mid = "0123456789abcdef0123456789abcdef"
    noisy = f"Welcome!\n__ddtreectl_identity__\n{mid}\n__ddtreectl_identity__\n"
    assert parse_identity(noisy, "h") == (mid, ())
    gpus = (f"__ddtreectl_identity__\n{mid}\n__ddtreectl_identity__\n"
            "GPU-3f1b6c1e-8d1a-4a52-9a4e-0c1f2d3e4f50\nGPU-aaaaaaaa-8d1a-4a52-9a4e-0c1f2d3e4f51\n")
    assert parse_identity(gpus, "h")[1] == ("GPU-3f1b6c1e-8d1a-4a52-9a4e-0c1f2d3e4f50",
                                            "GPU-aaaaaaaa-8d1a-4a52-9a4e-0c1f2d3e4f51")


def test_trust_through_a_jump_host(start_sshd: Start, tmp_path: Path) -> None:
    jump, target = start_sshd(), start_sshd()
    inv_path = tmp_path / "hosts.yaml"
    inv_path.write_text(
        "hosts:\n"
        "  gate:\n"
        "    address: 127.0.0.1\n"
        f"    port: {jump.port}\n"
        f"    identity_file: {jump.client_key}\n"
        f"    host_key: {jump.host_key}\n"
        "  inner:\n"
        "    address: 127.0.0.1\n"
        f"    port: {target.port}\n"
        f"    identity_file: {target.client_key}\n"
        "    jump_host: gate\n"
    )
    code, out, err = _cli(["-i", str(inv_path), "trust", "inner", "--yes"])
    assert code == 0, err
    assert f"127.0.0.1:{target.port} via gate" in out
    inv = load(inv_path)
    assert inv.host("inner").host_key == target.host_key
    with connect(inv.host("inner"), inv) as t:
        assert t.run("echo $SSH_CONNECTION").stdout.split()[3] == str(target.port)


def test_trust_refuses_a_different_machine_id_unless_replace(start_sshd: Start, tmp_path: Path) -> None:
    sshd = start_sshd()
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd, host_key=sshd.host_key)
    with inv_path.open("a") as fh:
        fh.write("    machine_id: 00000000000000000000000000000001\n")
    code, _, err = _cli(["-i", str(inv_path), "trust", "box", "--yes"])
    assert code == 4 and "differs from the recorded 00000000000000000000000000000001" in err
    assert "--replace" in err
    code, _, err = _cli(["-i", str(inv_path), "trust", "box", "--yes", "--replace"])
    assert code == 0, err
    assert load(inv_path).host("box").machine_id == Path("/etc/machine-id").read_text().strip()


def test_trust_without_an_answer_on_stdin_is_a_usage_error(start_sshd: Start, tmp_path: Path) -> None:
    """No terminal and no --yes (a script, cron, CI): the prompt meets end-of-file. That is not an
    interruption (it was exit 130, "interrupted"): say that nobody answered and how to proceed."""
    sshd = start_sshd()
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd)
    before = inv_path.read_text()
    code, out, err = _cli(["-i", str(inv_path), "trust", "box"], stdin="")
    assert code == 2, err
    assert PublicKey.parse(sshd.host_key).fingerprint in out
    assert "interrupted" not in err and "no answer" in err and "--yes" in err
    assert inv_path.read_text() == before


def test_replace_without_an_answer_hints_the_command_that_replaces(start_sshd: Start, tmp_path: Path) -> None:
    """The hint for a --replace that nobody answered said `trust box --yes`, which then refuses
    because a different key is pinned: it must keep --replace."""
    sshd = start_sshd()
    old = keygen(tmp_path / "old")
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd, host_key=old)
    code, out, err = _cli(["-i", str(inv_path), "trust", "box", "--replace"], stdin="")
    assert code == 2, err
    assert "REPLACING" in out and "no answer" in err
    assert "`ddtreectl trust box --replace --yes`" in err, err
    assert old in inv_path.read_text()


def test_status_of_a_never_trusted_host_says_so(start_sshd: Start, tmp_path: Path) -> None:
    """The summary of `status` for a host with no pinned key must not claim a pinned key differs."""
    sshd = start_sshd()
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd)
    code, _, err = _cli(["-i", str(inv_path), "status", "box"])
    assert code == 4
    assert "not the one pinned" not in err and "re-trust" not in err
    assert "no pinned host key" in err and "ddtreectl trust box" in err


def test_trust_on_a_host_whose_nvidia_smi_is_missing_keeps_the_recorded_gpu_uuids(
        start_sshd: Start, tmp_path: Path) -> None:
    """Re-running `trust` where nvidia-smi is missing (or failing, or too slow) read no GPU, and the
    recorded UUIDs were replaced by an empty list: set-ip then said "GPU UUIDs not recorded (not
    checked)". The throwaway sshd runs on this machine, which has no nvidia-smi."""
    if shutil.which("nvidia-smi", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
        pytest.skip("this machine has an nvidia-smi")
    sshd = start_sshd()
    uuid = "GPU-3f1b6c1e-8d1a-4a52-9a4e-0c1f2d3e4f50"
    inv_path = _inventory(tmp_path / "hosts.yaml", sshd, host_key=sshd.host_key)
    machine_id = Path("/etc/machine-id").read_text().strip()
    inv_path.write_text(inv_path.read_text() + f"    machine_id: {machine_id}\n    gpus: 1\n    gpu_uuids: [{uuid}]\n")

    code, out, err = _cli(["-i", str(inv_path), "trust", "box"])
    assert code == 0, err
    assert load(inv_path).host("box").gpu_uuids == (uuid,)
    assert "already trusted" in out
    assert "warning: box: GPU UUIDs not read (nvidia-smi is not installed): the 1 recorded are kept" in err

    # Nothing recorded yet and gpus: 1: trust pins the key and says set-ip cannot check the GPUs.
    fresh = _inventory(tmp_path / "fresh.yaml", sshd)
    fresh.write_text(fresh.read_text() + "    gpus: 1\n")
    code, out, err = _cli(["-i", str(fresh), "trust", "box", "--yes"])
    assert code == 0, err
    assert load(fresh).host("box").gpu_uuids == ()
    assert "none recorded, so set-ip cannot check this host's GPUs" in err


def test_gpu_query_status_is_read_from_the_identity_output() -> None:
    mid = "0123456789abcdef0123456789abcdef"
    head = f"__ddtreectl_identity__\n{mid}\n__ddtreectl_identity__\n"
    assert gpu_query_status(head + "GPU-1\n@@gpus-rc=0\n") == "0"
    assert gpu_query_status(head + "@@gpus-rc=missing\n") == "missing"
    assert gpu_query_status(head + "@@gpus-rc=124\n") == "124"  # timeout(1) ran out
    assert gpu_query_status(head) is None
