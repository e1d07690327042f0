"""Benchmark: `ddtreectl status` fan-out on real test hosts, against Ansible ad-hoc, in ONE run.

Boots N real systemd + sshd test hosts (tests/testbed), gives each the same small service unit, a
release tree and an nvidia-smi stub (8 GPUs), then measures wall time (median of --runs, runs
interleaved so drift hits every case alike):

  1. `ddtreectl status --json` on 1 host  vs  on all N hosts          (target: N <= 1.5x one)
     warm: connection reuse on, the OpenSSH masters of the previous run up (the normal case when
     an operator runs commands in a row); cold: `--no-reuse`, a fresh connection per host.
  2. the same N hosts through Ansible ad-hoc (`ansible all -m shell`) running the SAME probe script
     with the same key, known_hosts and strict host-key checking      (target: ddtreectl >= 5x faster)
     — with Ansible's defaults (pipelining on, SSH ControlPersist: warm masters after the first
     run), the peer of ddtreectl warm; and with a fresh SSH connection per run, the peer of
     ddtreectl cold.
  3. `ddtreectl --help`  vs  `python -c pass`                          (start-up cost)

Usage (root, testbed packages installed; ansible-core from PyPI: `pip install ansible-core`):
    python3 bench/status_fanout.py [--hosts 8] [--runs 7]
Prints a table; asserts nothing about timings. Every measured command's output is checked once
(all hosts answered, and over the connection kind the case claims) so a fast failure cannot pass
for a fast answer. Masters of both tools live in private directories closed at the end.
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
from ddtreectl.transport.control import ENV_CONTROL_DIR, close_all_masters  # noqa: E402
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
    # Short: master socket paths max out at 108 bytes.
    control_dir = tempfile.mkdtemp(prefix="ddt-bench-cm-", dir="/tmp")
    ddt_env = {**os.environ, ENV_CONTROL_DIR: control_dir}
    with tempfile.TemporaryDirectory(prefix="ddtree-bench-") as tmp, Fleet() as fleet:
        work = Path(tmp)
        try:
            times, inner, keys = _run(fleet, work, exe, names, ddt_env, args.runs)
        finally:
            close_all_masters(control_dir)
            close_all_masters(str(work / "cp"))  # Ansible's ControlPersist masters
            shutil.rmtree(control_dir, ignore_errors=True)
    _report(times, inner, keys, args.runs, len(names))


def _run(fleet: Fleet, work: Path, exe: str, names: list[str], ddt_env: dict[str, str],
         runs: int) -> tuple[dict[str, list[float]], dict[str, list[float]], list[str]]:
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
    n = len(hosts)

    # Check every case once: all hosts answered, over the connection kind the case claims. The
    # first reuse run starts the masters (the warm cases then find them up).
    for targets, count in (([names[0]], 1), ([], n)):
        for extra, kinds in (([], {"new", "reused"}), (["--no-reuse"], {"paramiko"})):
            doc = json.loads(run(ddt + extra + targets, ddt_env))
            assert doc["summary"]["answered"] == count, doc["summary"]
            assert {h["connection"] for h in doc["hosts"]} <= kinds, doc["hosts"]
            assert all(h["service"]["state"] == "running" and h["gpus"]["found"] == 8 for h in doc["hosts"])
    for env in (ansible_env, no_cp_env):
        out = run(ansible_argv, env)
        assert out.count("| CHANGED | rc=0 >>") == n and out.count("@@ddtree-end disk") == n, out[-3000:]

    inner: dict[str, list[float]] = {}

    def status(case: str, args: list[str], kind: str) -> None:
        doc = json.loads(run(ddt + args, ddt_env))
        assert all(h["connection"] == kind for h in doc["hosts"]), (case, doc["hosts"])
        inner.setdefault(case, []).append(doc["elapsed_ms"] / 1000)

    cases: dict[str, Callable[[], object]] = {
        "ddtreectl status, 1 host, warm (reuse)": lambda: status("w1", [names[0]], "reused"),
        f"ddtreectl status, {n} hosts, warm (reuse)": lambda: status("wn", [], "reused"),
        "ddtreectl status, 1 host, cold (--no-reuse)": lambda: status("c1", ["--no-reuse", names[0]], "paramiko"),
        f"ddtreectl status, {n} hosts, cold (--no-reuse)": lambda: status("cn", ["--no-reuse"], "paramiko"),
        f"ansible -m shell, {n} hosts (defaults: ControlPersist)": lambda: run(ansible_argv, ansible_env),
        f"ansible -m shell, {n} hosts (fresh SSH per run)": lambda: run(ansible_argv, no_cp_env),
        "ddtreectl --help": lambda: run([exe, "--help"]),
        "python -c pass": lambda: run([sys.executable, "-c", "pass"]),
    }
    load_before = os.getloadavg()
    times = measure(cases, runs)
    load_after = os.getloadavg()
    print(f"load average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in load_before)}, "
          f"after {'/'.join(f'{x:.1f}' for x in load_after)}")
    return times, inner, list(cases)


def _report(times: dict[str, list[float]], inner: dict[str, list[float]], keys: list[str],
            runs: int, n: int) -> None:
    med = {name: statistics.median(ts) for name, ts in times.items()}
    w1, wn, c1, cn, ans, ans_fresh, help_k, py_k = keys
    print(f"\nmedian of {runs} runs each (interleaved), {n} test hosts, {os.cpu_count()} CPUs\n")
    print(f"{'case':<58} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name in keys:
        ts = times[name]
        print(f"{name:<58} {med[name]:>9.3f} {min(ts):>7.3f} {max(ts):>7.3f}")
    fan = {k: statistics.median(v) for k, v in inner.items()}
    print(f"  (of which the fan-out itself, connect + probe, from the JSON's elapsed_ms: warm 1 host "
          f"{fan['w1']:.3f} s, {n} hosts {fan['wn']:.3f} s; cold 1 host {fan['c1']:.3f} s, {n} hosts "
          f"{fan['cn']:.3f} s; the rest is interpreter start and imports)")

    def line(label: str, ratio: float, target: str) -> None:
        print(f"  {label:<52} {ratio:6.2f}x   {target}")

    print("\nratios")
    line(f"{n} hosts / 1 host (ddtreectl warm)", med[wn] / med[w1], "target <= 1.5x")
    line(f"{n} hosts / 1 host (ddtreectl cold)", med[cn] / med[c1], "target <= 1.5x")
    line(f"ansible defaults / ddtreectl warm ({n} hosts)", med[ans] / med[wn], "target >= 5x (warm vs warm)")
    line(f"ansible fresh SSH / ddtreectl cold ({n} hosts)", med[ans_fresh] / med[cn], "target >= 5x (fresh vs fresh)")
    line(f"ansible defaults / ddtreectl cold ({n} hosts)", med[ans] / med[cn], "(their warm vs our cold)")
    print(f"  {'ddtreectl --help / python -c pass':<52} {med[help_k] / med[py_k]:6.2f}x   "
          f"(+{(med[help_k] - med[py_k]) * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
