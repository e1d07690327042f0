"""`ddtreectl gpus` through the INSTALLED console script on a `transport: local` host, with an
`nvidia-smi` stand-in first on PATH (fixture output at the command boundary; the sampler, parser,
verdict, fan-out and exit codes are the real ones)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from tests.probes.fixtures import fixture


def setup(tmp_path: Path, gpus_fixture: str) -> tuple[Path, dict[str, str]]:
    """An inventory with one local host (1 GPU) and a PATH whose nvidia-smi is busy while `busy` exists."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "idle.txt").write_text(fixture(gpus_fixture))
    (tmp_path / "busy.txt").write_text(fixture("nvidia-smi-gpus-h200-1x-memory-no-process.txt"))
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.write_text(f"""#!/bin/sh
case "$1" in
  --query-gpu=*) if [ -e {tmp_path}/busy ]; then cat {tmp_path}/busy.txt; else cat {tmp_path}/idle.txt; fi ;;
esac
""")
    stub.chmod(0o755)
    inventory = tmp_path / "hosts.yaml"
    inventory.write_text(f"hosts:\n  box:\n    transport: local\n    address: 127.0.0.1\n    gpus: 1\n"
                         f"    remote_root: {tmp_path}/root\n")
    return inventory, {**os.environ, "PATH": f"{tmp_path}/bin:{os.environ['PATH']}"}


def ddtreectl(inventory: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    if exe is None:
        pytest.skip("ddtreectl is not installed (python3 -m pip install -e .)")
    return subprocess.run([exe, "-i", str(inventory), "gpus", "box", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_idle_busy_and_json(tmp_path: Path) -> None:
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    idle = ddtreectl(inventory, env, "--json", "--samples", "2", "--interval", "0.1")
    assert idle.returncode == 0, idle.stderr
    doc = json.loads(idle.stdout)
    assert doc["schema"] == "ddtreectl.gpus/1" and doc["hosts"][0]["verdict"] == "idle"
    (tmp_path / "busy").touch()
    busy = ddtreectl(inventory, env, "--samples", "1")
    assert busy.returncode == 7
    assert "BUSY (memory)" in busy.stdout and "20993 MiB of 143771 MiB used" in busy.stdout


def test_wait_idle_polls_until_the_gpu_is_free(tmp_path: Path) -> None:
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    (tmp_path / "busy").touch()
    freed = threading.Timer(3.0, (tmp_path / "busy").unlink)
    freed.start()
    try:
        run = ddtreectl(inventory, env, "--wait-idle", "--timeout", "60", "--json", "--samples", "1")
    finally:
        freed.join()
    assert run.returncode == 0, run.stderr
    host = json.loads(run.stdout)["hosts"][0]
    assert host["verdict"] == "idle" and host["rounds"] >= 2


def test_wait_idle_gives_up_at_the_timeout_and_unknown_is_never_idle(tmp_path: Path) -> None:
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-na-fields.txt")
    run = ddtreectl(inventory, env, "--wait-idle", "--timeout", "1", "--json", "--samples", "1")
    assert run.returncode == 7
    host = json.loads(run.stdout)["hosts"][0]
    # three GPUs where the inventory says one, one of them busy: never idle
    assert host["verdict"] == "busy" and "expected 1 GPUs, nvidia-smi listed 3" in host["reasons"]


def test_wait_idle_does_not_wait_for_an_nvidia_smi_that_is_not_installed(tmp_path: Path) -> None:
    """Sampling again cannot install nvidia-smi: --wait-idle (and `mode HOST dev`, which waits the
    same way for --idle-timeout, 120 s by default) answers "unknown" after the first round instead
    of polling until the timeout."""
    bare = "/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("nvidia-smi", path=bare):
        pytest.skip("this machine has an nvidia-smi")
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    env["PATH"] = bare
    run = ddtreectl(inventory, env, "--wait-idle", "--timeout", "60", "--samples", "1", "--json")
    assert run.returncode == 7, run.stderr
    (host,) = json.loads(run.stdout)["hosts"]
    assert host["verdict"] == "unknown" and "nvidia-smi is not installed" in host["reasons"][0]
    assert host["rounds"] == 1


def test_the_text_line_says_how_the_verdict_was_sampled(tmp_path: Path) -> None:
    """Without nvidia-smi the sampler stops at its first query: the line said "1 sample(s), 1 s apart"
    whatever --samples said. Now it says nothing was sampled, and why; counts read as English."""
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    two = ddtreectl(inventory, env, "--samples", "2", "--interval", "0.1")
    assert two.returncode == 0 and "2 samples, 0.1 s apart" in two.stdout, two.stdout
    one = ddtreectl(inventory, env, "--samples", "1")
    assert one.returncode == 0 and "— 1 sample\n" in one.stdout and "apart" not in one.stdout, one.stdout
    bare = "/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("nvidia-smi", path=bare):
        pytest.skip("this machine has an nvidia-smi")
    env["PATH"] = bare
    missing = ddtreectl(inventory, env, "--samples", "5")
    assert missing.returncode == 7, missing.stderr
    assert "UNKNOWN" in missing.stdout and "not sampled: nvidia-smi is not installed" in missing.stdout, missing.stdout
    assert "sample(s)" not in missing.stdout and "apart" not in missing.stdout, missing.stdout
    # The reason line below it said "(1 of 1 samples)" while --json said `samples: 0`.
    assert "GPU state unknown: nvidia-smi is not installed\n" in missing.stdout, missing.stdout
    assert " of 1 samples" not in missing.stdout, missing.stdout


def test_json_says_nothing_was_sampled_without_nvidia_smi(tmp_path: Path) -> None:
    """The text line was fixed (above), but --json still said `samples: 1` whatever --samples said,
    as if one nvidia-smi reading had been taken. Now: `samples: 0` and `nvidia_smi_missing: true`;
    with nvidia-smi, `samples` is what --samples asked for and `nvidia_smi_missing` false."""
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    (sampled,) = json.loads(ddtreectl(inventory, env, "--json", "--samples", "2", "--interval", "0.1").stdout)["hosts"]
    assert (sampled["samples"], sampled["nvidia_smi_missing"]) == (2, False), sampled
    bare = "/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("nvidia-smi", path=bare):
        pytest.skip("this machine has an nvidia-smi")
    env["PATH"] = bare
    run = ddtreectl(inventory, env, "--json", "--samples", "5")
    assert run.returncode == 7, run.stderr
    (host,) = json.loads(run.stdout)["hosts"]
    assert (host["verdict"], host["samples"], host["nvidia_smi_missing"], host["nvidia_smi_ms"]) == \
        ("unknown", 0, True, None), host
    assert host["reasons"] == ["GPU state unknown: nvidia-smi is not installed"], host  # no "(1 of 1 samples)"


def test_a_host_declared_gpu_less_needs_no_nvidia_smi(tmp_path: Path) -> None:
    """`gpus: 0` and no nvidia-smi used to read "UNKNOWN" (exit 7), and `mode HOST dev` refused the host
    (its GPUs "can never be verified idle"). Declaring no GPUs is the answer: idle, exit 0, and the line
    says why nothing was sampled. A host that declares a GPU and cannot read it stays unknown (exit 7)."""
    bare = "/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("nvidia-smi", path=bare):
        pytest.skip("this machine has an nvidia-smi")
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    env["PATH"] = bare
    declared = inventory.read_text()
    inventory.write_text(declared.replace("gpus: 1", "gpus: 0"))
    text = ddtreectl(inventory, env)
    assert text.returncode == 0, text.stdout + text.stderr
    assert "box: IDLE — no GPUs, as the inventory says (gpus: 0; nvidia-smi is not installed)" in text.stdout
    (host,) = json.loads(ddtreectl(inventory, env, "--json").stdout)["hosts"]
    assert (host["verdict"], host["ok"], host["no_gpus"], host["nvidia_smi_missing"], host["reasons"]) == \
        ("idle", True, True, True, []), host
    mode = [shutil.which("ddtreectl") or "ddtreectl", "-i", str(inventory), "mode", "box"]
    dev = subprocess.run([*mode, "dev", "--reason", "cpu work", "--json"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert dev.returncode == 0, dev.stdout + dev.stderr
    doc = json.loads(dev.stdout)
    assert doc["lease"]["mode"] == "dev" and doc["gpus"]["verdict"] == "idle" and doc["forced"] == [], doc
    prod = subprocess.run([*mode, "prod"], capture_output=True, text=True, timeout=120, env=env)
    assert prod.returncode == 0, prod.stdout + prod.stderr

    inventory.write_text(declared)  # gpus: 1 and no nvidia-smi: a problem, reported as before
    one = ddtreectl(inventory, env, "--json")
    assert one.returncode == 7 and json.loads(one.stdout)["hosts"][0]["no_gpus"] is False, one.stdout
    refused = subprocess.run([*mode, "dev", "--reason", "x"], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 7 and "nvidia-smi is not installed" in refused.stderr, refused.stderr


def test_gpus_on_a_host_declared_gpu_less_are_not_idle(tmp_path: Path) -> None:
    """`gpus: 0` while nvidia-smi lists an idle GPU: status warned "expected 0 GPUs, found 1" but `gpus`
    said IDLE (exit 0), so `mode HOST dev` took a host whose inventory is wrong. Unknown, exit 7, as for
    a GPU missing from the count."""
    inventory, env = setup(tmp_path, "nvidia-smi-gpus-h200-1x.txt")
    inventory.write_text(inventory.read_text().replace("gpus: 1", "gpus: 0"))
    text = ddtreectl(inventory, env, "--samples", "1")
    assert text.returncode == 7, text.stdout + text.stderr
    assert "box: UNKNOWN" in text.stdout and "expected 0 GPUs, nvidia-smi listed 1" in text.stdout, text.stdout
    (host,) = json.loads(ddtreectl(inventory, env, "--json", "--samples", "1").stdout)["hosts"]
    assert (host["verdict"], host["ok"], host["no_gpus"]) == ("unknown", False, False), host
    # Waiting cannot make the count match the inventory: one round, not polling until the timeout.
    waited = ddtreectl(inventory, env, "--wait-idle", "--timeout", "60", "--samples", "1", "--json")
    (host,) = json.loads(waited.stdout)["hosts"]
    assert (waited.returncode, host["verdict"], host["rounds"]) == (7, "unknown", 1), waited.stdout
