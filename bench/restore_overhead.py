"""Benchmark: what `ddtreectl restore-service` costs beyond the service's own time to become ready.

On one real test host (tests/testbed) with the engine's reference server as the service, each round:

  peer   `systemctl start` inside the host, then a tight in-host poll (10 ms) of /health_generate
         until it answers 200: the service's own time to become ready, with no SSH and no gate.
  ours   the installed `ddtreectl restore-service HOST --json`, from process start to exit: preflight
         (probe, unit drift, GPU holders), enable, start, and all six gate phases over SSH.

Both start from a stopped service; rounds alternate so drift hits both alike. Prints medians and the
overhead (ours - peer; target under 1 s). Asserts nothing about timings.

Usage (root, testbed packages installed):  python3 bench/restore_overhead.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.test_restore_service import SERVICES, UNIT, install, lay_out_release  # noqa: E402
from tests.testbed import Fleet  # noqa: E402

POLL = ("import sys, time, urllib.request\n"
        "while True:\n"
        "    try:\n"
        "        if urllib.request.urlopen('http://127.0.0.1:30000/health_generate', timeout=30).status == 200:\n"
        "            break\n"
        "    except Exception:\n"
        "        pass\n"
        "    time.sleep(0.01)\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    exe = shutil.which("ddtreectl")
    if exe is None:
        print("install the CLI first: python3 -m pip install -e .", file=sys.stderr)
        return 2
    with Fleet() as fleet:
        (host,) = fleet.boot(["bench-restore"])
        work = fleet.workdir / "bench"
        work.mkdir()
        inventory = fleet.inventory([host], work / "hosts.yaml", services={"ref": SERVICES["ref"]},
                                    host_overrides={host.name: {"service": "ref", "role": "prod"}})
        shutil.copytree(REPO / "templates", work / "templates")
        lay_out_release(host)
        install(inventory, host.name)
        peer, ours = [], []
        for _ in range(args.rounds):
            host.systemctl("stop", UNIT)
            t0 = time.perf_counter()
            host.systemctl("start", UNIT)
            host.sh(f"{sys.executable} -c \"{POLL}\"", timeout=300)
            peer.append(time.perf_counter() - t0)

            host.systemctl("stop", UNIT)
            t0 = time.perf_counter()
            run = subprocess.run([exe, "-i", str(inventory), "restore-service", host.name, "--json"],
                                 capture_output=True, text=True, timeout=600)
            ours.append(time.perf_counter() - t0)
            if run.returncode != 0:
                print(run.stdout, run.stderr, file=sys.stderr)
                return 1
    p, o = statistics.median(peer), statistics.median(ours)
    print(f"{'case':<58} {'median s':>9}")
    print(f"{'service alone: systemctl start + in-host poll to ready':<58} {p:>9.2f}")
    print(f"{'ddtreectl restore-service (preflight + start + 6-phase gate)':<58} {o:>9.2f}")
    print(f"{'overhead of restore-service (target < 1 s)':<58} {o - p:>9.2f}")
    print(f"rounds: {args.rounds}; peer runs {[round(x, 2) for x in peer]}; ours {[round(x, 2) for x in ours]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
