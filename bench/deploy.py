"""Benchmark: `ddtreectl deploy` on a real test host — first deploy vs no-op redeploy vs one-file change.

Boots one real systemd + sshd test host (tests/testbed) and, in ONE run, --runs times:

  1. first deploy: the host's remote root wiped (no release, no build workspace): rsync + configure +
     full build + self-test (skipped: no GPU) + units + switch
  2. no-op redeploy, same inputs (median of 3)                    target: ≤ 15% of the first deploy
  3. one changed engine file (a comment appended to one op's .cu)   target: rebuilds only that object

Every deploy goes through the installed CLI (`ddtreectl deploy --json`) over real SSH; its JSON is
checked (action, steps, compiled objects) so a fast failure cannot pass for a fast deploy. Builds
are kept small by default (one op, one arch, as in the tests); --ops all builds every op.

Usage (root, testbed packages installed):  python3 bench/deploy.py [--runs 3] [--ops draft_topk_lse] [--archs 90]
Prints a table with ratios; asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.testbed import Fleet  # noqa: E402

CHANGED = "src/draft_topk_lse.cu"


def deploy(inventory: Path, host: str) -> tuple[float, dict[str, Any]]:
    exe = shutil.which("ddtreectl")
    assert exe, "install the CLI first: python3 -m pip install -e ."
    t0 = time.monotonic()
    proc = subprocess.run([exe, "-i", str(inventory), "deploy", "--host", host, "--json"],
                          capture_output=True, text=True, timeout=3600)
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"deploy failed (exit {proc.returncode}):\n{proc.stderr}")
    return elapsed, json.loads(proc.stdout)["hosts"][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ops", default="draft_topk_lse", help="DDTREE_OPS (\"all\" for every op)")
    parser.add_argument("--archs", default="90")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ddtree-bench-deploy-") as tmp, Fleet() as fleet:
        work = Path(tmp)
        subprocess.run(["rsync", "-a", "--exclude=/build*/", "--exclude=__pycache__/", "--exclude=*.pyc",
                        f"{REPO}/engine/", f"{work}/engine/"], check=True)
        shutil.copytree(REPO / "templates", work / "templates")
        (host,) = fleet.boot(["bench-deploy"])
        build = {"cuda_archs": args.archs.split(";"), "cmake_args": [f"-DDDTREE_OPS={args.ops}"]}
        inventory = fleet.inventory([host], work / "hosts.yaml", host_overrides={host.name: {"build": build}})
        changed = work / "engine" / CHANGED
        original = changed.read_text()
        firsts: list[float] = []
        noops: list[float] = []
        ones: list[float] = []
        first_steps: list[int] = []
        one_steps: list[int] = []
        compiled: list[str] = []
        load_before = os.getloadavg()[0]
        for run in range(args.runs):
            host.sh("rm -rf /opt/ddtree")  # a true first deploy: no release, no build workspace
            changed.write_text(original)
            t, first = deploy(inventory, host.name)
            assert first["action"] == "deployed" and first["built"], first
            firsts.append(t)
            first_steps.append(first["ninja_steps"])
            for _ in range(3):
                t, noop = deploy(inventory, host.name)
                assert noop["action"] == "noop" and not noop["built"], noop
                noops.append(t)
            changed.write_text(original + f"\n// bench run {run}\n")
            t, one = deploy(inventory, host.name)
            assert one["action"] == "deployed", one
            ones.append(t)
            one_steps.append(one["ninja_steps"])
            compiled = list(one["compiled"])
        changed.write_text(original)
        load_after = os.getloadavg()[0]

    first_m, noop_m, one_m = (statistics.median(x) for x in (firsts, noops, ones))
    print(f"\nddtreectl deploy on 1 real test host (SSH, systemd), ops={args.ops}, archs={args.archs}, "
          f"{args.runs} runs; {os.cpu_count()} CPUs, load average {load_before:.1f} before / "
          f"{load_after:.1f} after\n")
    print(f"{'case':<34}{'median s':>10}{'min s':>9}{'max s':>9}{'vs first':>10}{'ninja steps':>13}")
    rows = [("first deploy (empty host)", firsts, first_steps), ("no-op redeploy (median of 3/run)", noops, None),
            ("one changed file", ones, one_steps)]
    for name, times, steps in rows:
        m = statistics.median(times)
        step_text = "-" if steps is None else "/".join(str(s) for s in sorted(set(steps)))
        print(f"{name:<34}{m:>10.2f}{min(times):>9.2f}{max(times):>9.2f}{m / first_m:>9.1%}{step_text:>13}")
    print(f"\nno-op / first = {noop_m / first_m:.1%} (target ≤ 15%); one-file / first = {one_m / first_m:.1%}")
    print(f"one-file change compiled: {', '.join(compiled) or 'nothing'} "
          f"({max(one_steps)} of {max(first_steps)} ninja steps)")


if __name__ == "__main__":
    main()
