"""Benchmark: `ddtreectl status` fan-out on real test hosts, against Ansible ad-hoc, in ONE run.

Boots N real systemd + sshd test hosts (tests/testbed), gives each the same small service unit, a
release tree and an nvidia-smi stub (8 GPUs), then measures wall time (median of --runs, runs
interleaved so drift hits every case alike):

  1. `ddtreectl status --json` on 1 host  vs  on all N hosts          (target: N ≤ 1.5x one)
  2. the same N hosts through Ansible ad-hoc (`ansible all -m shell`) running the SAME probe script
     with the same key, known_hosts and strict host-key checking      (target: ddtreectl ≥ 5x faster)
     — once with Ansible's defaults (pipelining on, SSH ControlPersist: warm master connections
     after the first run) and once with a fresh SSH connection per run like ddtreectl.
  3. `ddtreectl --help`  vs  `python -c pass`                          (start-up cost)

Usage (root, testbed packages installed; ansible-core from PyPI: `pip install ansible-core`):
    python3 bench/status_fanout.py [--hosts 8] [--runs 7]
Prints a table; asserts nothing about timings. Every measured command's output is checked once
(all hosts answered) so a fast failure cannot pass for a fast answer.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ddtreectl.probes.status import DEFAULT_GPU_TIMEOUT_S, load_script  # noqa: E402
from tests.probes.fixtures import fixture  # noqa: E402
from tests.testbed import Fleet  # noqa: E402
from tests.testbed.host import TestHost  # noqa: E402

UNIT = "ddtree-fx.service"
SERVICES = {"fx": {"template": "sglang-ddtree.service.j2", "port": 30000, "model_path": "/models/fx",
                   "served_model_name": "fx", "unit_name": "ddtree-fx"}}
UNIT_TEXT = ("[Service]\nWorkingDirectory=/opt/ddtree/current\nExecStart=/bin/sleep infinity\n"
             "[Install]\nWantedBy=multi-user.target\n")


def nvidia_smi_stub() -> str:
    gpus = fixture("nvidia-smi-gpus-rtxpro6000-8x-serving.txt")
    apps = fixture("nvidia-smi-apps-rtxpro6000-8x-serving.txt")
    return ("#!/bin/sh\ncase \"$1\" in\n"
            f"  --query-gpu=*) cat <<'EOF'\n{gpus}EOF\n  ;;\n"
            f"  --query-compute-apps=*) cat <<'EOF'\n{apps}EOF\n  ;;\n  *) exit 2 ;;\nesac\n")


def prepare(host: TestHost) -> None:
    host.sh("mkdir -p /opt/ddtree/releases/r1 && touch /opt/ddtree/releases/r1/.build-stamp"
            " && ln -sfn releases/r1 /opt/ddtree/current")
    host.write_file(f"/etc/systemd/system/{UNIT}", UNIT_TEXT)
    host.systemctl("daemon-reload")
    host.systemctl("enable", "--now", UNIT)
    # Ansible runs the very same probe script; it sits on the host so the ad-hoc command line stays
    # short (ddtreectl sends it inline, in the same round trip).
    host.write_file("/root/ddtree-status.sh", load_script("status.sh"))


def ddtreectl_exe() -> str:
    beside = Path(sys.executable).parent / "ddtreectl"  # not a pyenv shim: no shell start-up on top
    found = str(beside) if beside.exists() else shutil.which("ddtreectl")
    if not found:
        sys.exit("ddtreectl is not installed: python3 -m pip install -e .")
    return found


def run(argv: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode not in ok:
        sys.exit(f"{argv[0]} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def ansible_setup(work: Path, fleet: Fleet, hosts: list[TestHost]) -> tuple[list[str], dict[str, str]]:
    known_hosts = work / "known_hosts"
    known_hosts.write_text("".join(f"{h.address} {h.host_key}\n" for h in hosts))
    ini = work / "ansible.ini"
    ini.write_text(
        "[bench]\n" + "".join(f"{h.name} ansible_host={h.address}\n" for h in hosts)
        + "\n[all:vars]\nansible_user=root\n"
        f"ansible_ssh_private_key_file={fleet.client_key}\n"
        "ansible_python_interpreter=/usr/bin/python3\n"
        f"ansible_ssh_common_args='-o UserKnownHostsFile={known_hosts} -o GlobalKnownHostsFile=/dev/null "
        "-o StrictHostKeyChecking=yes'\n")
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_PIPELINING": "True",
           "ANSIBLE_HOME": str(work / "ansible-home"), "ANSIBLE_LOCAL_TEMP": str(work / "ansible-tmp"),
           "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"), "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_DEPRECATION_WARNINGS": "False", "LC_ALL": "C.UTF-8"}
    exe = shutil.which("ansible")
    if exe is None:
        sys.exit("ansible is not installed: python3 -m pip install ansible-core")
    command = "sh /root/ddtree-status.sh " + " ".join(
        shlex.quote(p) for p in (UNIT, "/opt/ddtree", str(DEFAULT_GPU_TIMEOUT_S)))
    argv = [exe, "all", "-i", str(ini), "-f", str(len(hosts)), "-m", "shell", "-a", command]
    return argv, env


def measure(cases: dict[str, Callable[[], object]], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    exe = ddtreectl_exe()
    names = [f"bench-{i}" for i in range(args.hosts)]
    with tempfile.TemporaryDirectory(prefix="ddtree-bench-") as tmp, Fleet() as fleet:
        work = Path(tmp)
        t0 = time.monotonic()
        hosts = fleet.boot(names, gpus_stub={n: nvidia_smi_stub() for n in names})
        print(f"booted {len(hosts)} test hosts in {time.monotonic() - t0:.1f} s")
        for host in hosts:
            prepare(host)
        inventory = fleet.inventory(hosts, work / "hosts.yaml", services=SERVICES,
                                    host_overrides={h.name: {"service": "fx", "gpus": 8} for h in hosts})
        ansible_argv, ansible_env = ansible_setup(work, fleet, hosts)
        no_cp_env = {**ansible_env, "ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ControlPath=none"}
        ddt = [exe, "-i", str(inventory), "status", "--json"]

        # Check every case once: all hosts answered, with the facts we time.
        one, many = json.loads(run(ddt + [names[0]])), json.loads(run(ddt))
        assert one["summary"]["answered"] == 1 and many["summary"]["answered"] == len(hosts), many["summary"]
        assert all(h["service"]["state"] == "running" and h["gpus"]["found"] == 8 for h in many["hosts"])
        for env in (ansible_env, no_cp_env):
            out = run(ansible_argv, env)
            assert out.count("| CHANGED | rc=0 >>") == len(hosts) and out.count("@@ddtree-end disk") == len(hosts), out[-3000:]

        inner: dict[int, list[float]] = {1: [], len(hosts): []}

        def status(targets: list[str]) -> None:
            doc = json.loads(run(ddt + targets))
            inner[len(doc["hosts"])].append(doc["elapsed_ms"] / 1000)

        cases: dict[str, Callable[[], object]] = {
            "ddtreectl status, 1 host": lambda: status([names[0]]),
            f"ddtreectl status, {len(hosts)} hosts": lambda: status([]),
            f"ansible -m shell, {len(hosts)} hosts (defaults: ControlPersist)": lambda: run(ansible_argv, ansible_env),
            f"ansible -m shell, {len(hosts)} hosts (fresh SSH per run)": lambda: run(ansible_argv, no_cp_env),
            "ddtreectl --help": lambda: run([exe, "--help"]),
            "python -c pass": lambda: run([sys.executable, "-c", "pass"]),
        }
        load_before = os.getloadavg()[0]
        times = measure(cases, args.runs)
        load_after = os.getloadavg()[0]

    med = {name: statistics.median(ts) for name, ts in times.items()}
    keys = list(cases)
    one_k, many_k, ans_k, ans_fresh_k, help_k, py_k = keys
    print(f"\nmedian of {args.runs} runs each (interleaved), {len(hosts)} test hosts, "
          f"{os.cpu_count()} CPUs, load average {load_before:.1f} before / {load_after:.1f} after\n")
    print(f"{'case':<58} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name in keys:
        ts = times[name]
        print(f"{name:<58} {med[name]:>9.3f} {min(ts):>7.3f} {max(ts):>7.3f}")
    print(f"  (of which the fan-out itself, connect + probe, from the JSON's elapsed_ms: "
          f"1 host {statistics.median(inner[1]):.3f} s, {len(hosts)} hosts "
          f"{statistics.median(inner[len(hosts)]):.3f} s; the rest is interpreter start and imports)")
    print("\nratios")
    print(f"  {len(hosts)} hosts / 1 host (ddtreectl)           {med[many_k] / med[one_k]:6.2f}x   target ≤ 1.5x")
    print(f"  ansible defaults / ddtreectl ({len(hosts)} hosts)     {med[ans_k] / med[many_k]:6.2f}x   target ≥ 5x")
    print(f"  ansible fresh SSH / ddtreectl ({len(hosts)} hosts)    {med[ans_fresh_k] / med[many_k]:6.2f}x")
    print(f"  ddtreectl --help / python -c pass        {med[help_k] / med[py_k]:6.2f}x   "
          f"(+{(med[help_k] - med[py_k]) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
