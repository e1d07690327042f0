#!/usr/bin/env python3
"""SSH exec latency: ddtreectl's transport vs its peers, measured in the same run on one sshd.

Boots a throwaway real sshd on 127.0.0.1 (tests/transport/sshd.py; root, openssh-server and
unshare needed; the machine's own ~/.bashrc is masked in sshd's mount namespace so rc-file cost
does not drown the transport cost) and prints medians of:

  cold   connect + auth + one `true` + close: ddtreectl, Fabric, OpenSSH `ssh host true`
  warm   one `true` on an open connection: ddtreectl (TCP_NODELAY), ddtreectl without it
         (= Paramiko's default socket), Fabric `run()`, OpenSSH through a ControlMaster socket

Usage: python3 -m pip install ".[bench]" && python3 bench/ssh_exec_latency.py [--samples N]   (Fabric is a bench peer only)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddtreectl.transport.ssh import open_ssh  # noqa: E402
from tests.transport.sshd import launch_sshd  # noqa: E402


def median_ms(fn: Callable[[], object], samples: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    import fabric

    with tempfile.TemporaryDirectory(prefix="ddtreectl-bench-") as tmp:
        proc, sshd = launch_sshd(Path(tmp) / "sshd")
        try:
            host = sshd.host()
            known = Path(tmp) / "known_hosts"
            known.write_text(f"[127.0.0.1]:{sshd.port} {sshd.host_key}\n")
            ssh = ["ssh", "-F", "/dev/null", "-i", str(sshd.client_key), "-o", "IdentitiesOnly=yes",
                   "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
                   "-o", "StrictHostKeyChecking=yes", "-p", str(sshd.port)]
            fab_kw = {"key_filename": str(sshd.client_key), "look_for_keys": False,
                      "allow_agent": False}

            def ddt_cold() -> None:
                with open_ssh(host) as t:
                    t.run("true")

            def fab_cold() -> None:
                with fabric.Connection("127.0.0.1", user="root", port=sshd.port,
                                       connect_kwargs=fab_kw) as c:
                    c.run("true", hide=True, in_stream=False)

            def ssh_cold() -> None:
                subprocess.run(ssh + ["root@127.0.0.1", "true"], check=True)

            n = args.samples
            rows: list[tuple[str, str, float]] = [
                ("cold", "ddtreectl connect+exec", median_ms(ddt_cold, n)),
                ("cold", "Fabric connect+run", median_ms(fab_cold, n)),
                ("cold", "OpenSSH `ssh host true`", median_ms(ssh_cold, n)),
            ]
            with open_ssh(host) as t:
                rows.append(("warm", "ddtreectl run (TCP_NODELAY)", median_ms(lambda: t.run("true"), n)))
            with open_ssh(host, nodelay=False) as t:
                rows.append(("warm", "ddtreectl run, no TCP_NODELAY", median_ms(lambda: t.run("true"), n)))
            with fabric.Connection("127.0.0.1", user="root", port=sshd.port, connect_kwargs=fab_kw) as c:
                rows.append(("warm", "Fabric run()", median_ms(
                    lambda: c.run("true", hide=True, in_stream=False), n)))
            control = Path(tmp) / "cm.sock"
            master = ssh + ["-o", "ControlMaster=yes", "-o", f"ControlPath={control}", "-N", "root@127.0.0.1"]
            mproc = subprocess.Popen(master)
            try:
                deadline = time.monotonic() + 10
                while not control.exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
                mux = ssh + ["-o", f"ControlPath={control}", "root@127.0.0.1", "true"]
                rows.append(("warm", "OpenSSH via ControlMaster", median_ms(
                    lambda: subprocess.run(mux, check=True), n)))
            finally:
                mproc.terminate()
                mproc.wait()
        finally:
            proc.kill()
            proc.wait()

    base = {kind: next(ms for k, name, ms in rows if k == kind and name.startswith("ddtreectl"))
            for kind in ("cold", "warm")}
    print(f"SSH exec latency on 127.0.0.1 (median of {args.samples}; ratio = peer / ddtreectl)")
    print(f"{'':5} {'what':34} {'ms':>8} {'ratio':>7}")
    for kind, name, ms in rows:
        print(f"{kind:5} {name:34} {ms:8.1f} {ms / base[kind]:6.1f}x")
    print(f"load average: {os.getloadavg()[0]:.1f} (figures are noisy when the machine is busy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
