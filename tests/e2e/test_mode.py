"""End-to-end: `ddtreectl mode`, `run` and `gpus` through the INSTALLED CLI on real systemd + sshd test
hosts, with the engine's reference server (`python -m ddtree_engine.serve`, /metrics with SGLang's
drain gauges) as the production service.

The hosts have no GPU: `nvidia-smi` is a stand-in at the command boundary that prints the captured
output shapes of tests/probes/fixtures (an H200 idle, or holding a CUDA context) and lists as compute
processes exactly the PIDs that really run on the host and "hold the GPU": the service's MainPID and
the PIDs a development command registered in /run/gpu-holders. Everything else is real: sshd, systemd
stopping and starting the unit, /proc for process owners and cgroups, the lease and lock files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.host_setup import install_service_units
from tests.probes.fixtures import fixture

pytestmark = pytest.mark.testbed

REPO = Path(__file__).resolve().parents[2]
UNIT = "md-ref.service"
PORT = 30000
HEALTH = {"unit_active_timeout": 30, "port_open_timeout": 120, "liveness_timeout": 60,
          "readiness_timeout": 120, "total_timeout": 300}
SERVICES = {"ref": {
    "template": "sglang-ddtree.service.j2", "python": sys.executable, "module": "ddtree_engine.serve",
    "unit_name": "md-ref", "port": PORT, "model_path": "/models/tiny-ddtree", "served_model_name": "tiny-ddtree",
    # One batch slot: requests queue behind each other, so a drain has several seconds of work to wait for.
    "extra_args": ["--allow-random-weights", "--max-running-requests", "1"],
    "speculative": {"algorithm": "DDTREE", "ddtree_budget": 7},
    "environment": {"PYTHONPATH": "/opt/ddtree/current/python", "OMP_NUM_THREADS": "1"},
    "health": HEALTH}}
# Greedy decoding of this prompt on the seed-0 random weights runs ~120 tokens before a stop token.
LONG_PROMPT = {"prompt": "x y z", "max_tokens": 1500, "temperature": 0}


def nvidia_smi_stand_in() -> str:
    idle = fixture("nvidia-smi-gpus-h200-1x.txt")
    busy = fixture("nvidia-smi-gpus-h200-1x-context-only.txt")
    app = fixture("nvidia-smi-apps-h200-1x-context-only.txt").strip()  # pid 30211, replaced below
    return f"""#!/bin/sh
pids=
for p in $(systemctl show -p MainPID --value {UNIT} 2>/dev/null) $(cat /run/gpu-holders 2>/dev/null); do
  case $p in ''|0|*[!0-9]*) continue ;; esac
  kill -0 "$p" 2>/dev/null && pids="$pids $p"
done
case "$1" in
  --query-gpu=*) if [ -n "$pids" ]; then printf '%s' '{busy}'; else printf '%s' '{idle}'; fi ;;
  --query-compute-apps=*) for p in $pids; do echo '{app}' | sed "s/, 30211, /, $p, /"; done ;;
  *) exit 2 ;;
esac
"""


def ddtreectl(*args: str, user: str = "alice", timeout: float = 400) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("ddtreectl")
    assert exe is not None, "install the CLI first: python3 -m pip install -e ."
    # operator() is user@machine: two operators on this one machine differ by $USER.
    env = {**os.environ, "USER": user, "LOGNAME": user, "COLUMNS": "200"}
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout, env=env)


def as_json(run: subprocess.CompletedProcess[str]) -> Any:
    try:
        return json.loads(run.stdout)
    except ValueError:
        raise AssertionError(f"not JSON (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None


def lay_out_release(host: Any) -> None:
    """A built release as deploy leaves it (engine Python package, build stamp, `current`)."""
    target = host.root / "opt/ddtree/releases/r1"
    shutil.copytree(REPO / "engine/python", target / "python", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (target / ".build-stamp").write_text(json.dumps({"id": "r1", "selftest": "skipped: no GPU"}) + "\n")
    host.sh("ln -sfn releases/r1 /opt/ddtree/current")


@pytest.fixture(scope="module")
def hosts(testbed: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    names = ["md-cycle", "md-race"]
    booted = testbed.boot(names, gpus_stub={n: nvidia_smi_stand_in() for n in names})
    path = testbed.inventory(booted, tmp_path_factory.mktemp("mode") / "hosts.yaml", services=SERVICES,
                             host_overrides={n: {"service": "ref", "role": "prod", "gpus": 1} for n in names})
    shutil.copytree(REPO / "templates", path.parent / "templates")
    for host in booted:
        lay_out_release(host)
        install_service_units(path, host.name)
    yield {h.name: h for h in booted}, path
    for host in booted:
        testbed.shutdown(host)


def in_flight(host: Any) -> int:
    with urllib.request.urlopen(f"http://{host.address}:{PORT}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith(("sglang:num_running_reqs", "sglang:num_queue_reqs")))


def complete(host: Any, answers: list[Any]) -> None:
    request = urllib.request.Request(f"http://{host.address}:{PORT}/v1/completions",
                                     data=json.dumps(LONG_PROMPT).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            answers.append((response.status, json.loads(response.read())))
    except Exception as exc:  # noqa: BLE001 - recorded and asserted on by the test
        answers.append(exc)


def lease(host: Any) -> dict[str, Any]:
    return dict(json.loads(host.read_file("/opt/ddtree/state/mode.json")))


def audit(host: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in host.read_file("/opt/ddtree/state/audit.log").splitlines()]


def test_prod_dev_prod_cycle_with_drain_run_and_a_gpu_holding_dev_process(hosts: Any) -> None:
    by_name, inv = hosts
    host = by_name["md-cycle"]
    i = str(inv)

    # Production first, through `mode prod` (the restore-service gate), from a host never switched.
    assert ddtreectl("-i", i, "mode", "md-cycle", "--json").returncode == 0
    up = ddtreectl("-i", i, "mode", "md-cycle", "prod", "--json")
    assert up.returncode == 0, up.stderr
    assert as_json(up)["restore"]["ok"] and host.systemctl("is-active", UNIT, check=False).stdout.strip() == "active"

    # `gpus` names the service's own process as the service's; the host is busy.
    g = ddtreectl("-i", i, "gpus", "md-cycle", "--json", "--samples", "2", "--interval", "0.2")
    assert g.returncode == 7, g.stdout + g.stderr
    (report,) = as_json(g)["hosts"]
    main_pid = int(host.systemctl("show", "-p", "MainPID", "--value", UNIT).stdout)
    assert report["verdict"] == "busy" and set(report["signals"]) == {"processes", "unit"}
    assert [(p["pid"], p["service"]) for p in report["processes"]] == [(main_pid, True)]

    # `run` on a production host is refused and runs nothing.
    refused = ddtreectl("-i", i, "run", "md-cycle", "--", "touch", "/tmp/should-not-exist")
    assert refused.returncode == 7 and "production mode" in refused.stderr
    assert not (host.root / "tmp/should-not-exist").exists()

    # prod -> dev while requests are in flight: the switch waits for them, then stops the service.
    answers: list[Any] = []
    clients = [threading.Thread(target=complete, args=(host, answers)) for _ in range(3)]
    for c in clients:
        c.start()
    deadline = time.monotonic() + 60
    while in_flight(host) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    dev = ddtreectl("-i", i, "mode", "md-cycle", "dev", "--reason", "bench tree attention", "--ttl", "2h")
    for c in clients:
        c.join(300)
    assert dev.returncode == 0, dev.stdout + dev.stderr
    assert "request(s) in flight" in dev.stderr and "no request running or queued" in dev.stderr
    counts = [line for line in dev.stderr.splitlines() if "request(s) in flight" in line]
    # 0 is the note's fact, not a count line; a count is said when it changes, not at every poll
    assert "0 request(s)" not in dev.stderr and all(a != b for a, b in zip(counts, counts[1:])), dev.stderr
    assert len(answers) == 3 and all(a[0] == 200 and a[1]["choices"][0]["finish_reason"] for a in answers), answers
    assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
    assert host.systemctl("is-enabled", UNIT, check=False).stdout.strip() == "disabled"
    record = lease(host)
    assert (record["mode"], record["reason"], record["unit"]) == ("dev", "bench tree attention", UNIT)
    assert record["holder"].startswith("alice@") and record["expires"] - record["since"] == 7200
    switch = audit(host)[-1]
    assert (switch["action"], switch["to"], switch["drain"]["drained"], switch["gpus"]) == ("mode", "dev", True, "idle")
    shown = as_json(ddtreectl("-i", i, "mode", "md-cycle", "--json"))
    assert shown["mode"] == "dev" and shown["lease"]["expired"] is False

    # `run` works for the holder: in the current release, output streamed, exit status passed through.
    ok = ddtreectl("-i", i, "run", "md-cycle", "--", "sh", "-c", "pwd -P; echo to-stderr >&2; exit 3")
    assert ok.returncode == 3 and ok.stdout.splitlines() == ["/opt/ddtree/releases/r1", "to-stderr"]
    other = ddtreectl("-i", i, "run", "md-cycle", "--", "true", user="bob")
    assert other.returncode == 8 and "alice@" in other.stderr

    # A development process holds the GPU: dev -> prod refuses (exit 7) and names it.
    holder = subprocess.Popen(
        [shutil.which("ddtreectl") or "ddtreectl", "-i", i, "run", "md-cycle", "--",
         "sh", "-c", "echo $$ > /run/gpu-holders; echo holding; exec sleep 300"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "USER": "alice", "LOGNAME": "alice"})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        dev_pid = int(host.read_file("/run/gpu-holders"))
        back = ddtreectl("-i", i, "mode", "md-cycle", "prod")
        assert back.returncode == 7, back.stdout + back.stderr
        assert f"pid {dev_pid} (root" in back.stderr and "sleep 300" in back.stderr
        assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
        assert lease(host)["mode"] == "dev"
        # The holder renews while its process runs: nothing is stopped or re-checked, the expiry moves.
        before = lease(host)
        renew = ddtreectl("-i", i, "mode", "md-cycle", "dev", "--reason", "longer bench", "--ttl", "3h")
        assert renew.returncode == 0, renew.stdout + renew.stderr
        after = lease(host)
        assert (after["since"], after["reason"]) == (before["since"], "longer bench")
        assert after["expires"] > before["expires"] and audit(host)[-1]["renewed"] is True
    finally:
        host.sh(f"kill {dev_pid} 2>/dev/null || true")  # the process the test started, by PID
        holder.wait(60)
    assert holder.returncode == 143  # SIGTERM, passed through by `run`

    # Once it has exited: dev -> prod restores through the gate and clears the lease.
    back = ddtreectl("-i", i, "mode", "md-cycle", "prod", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    result = as_json(back)
    assert result["restore"]["ok"] and result["restore"]["started"] and result["lease"]["mode"] == "prod"
    assert host.systemctl("is-enabled", UNIT, check=False).stdout.strip() == "enabled"
    assert [a["to"] for a in audit(host) if a["action"] == "mode"] == ["prod", "dev", "dev", "prod"]  # dev twice: renewal


def test_racing_operators_and_lease_expiry(hosts: Any) -> None:
    by_name, inv = hosts
    host = by_name["md-race"]
    i = str(inv)
    assert ddtreectl("-i", i, "mode", "md-race", "prod").returncode == 0

    # A stray process on the GPU: the switch stops the service, finds the GPUs still busy, and refuses
    # (exit 7, naming it) without recording a lease; the failed attempt is in the audit log.
    host.sh("sleep 300 >/dev/null 2>&1 & echo $! > /run/gpu-holders")
    stray = int(host.read_file("/run/gpu-holders"))
    try:
        busy = ddtreectl("-i", i, "mode", "md-race", "dev", "--reason", "x", "--idle-timeout", "2", "--json")
        assert busy.returncode == 7, busy.stdout + busy.stderr
        assert f"pid {stray} (root" in busy.stderr and "sleep 300" in busy.stderr
        assert "is stopped and disabled" in busy.stderr
        # --json: the switch's document says what it did before the refusal (it used to be the bare
        # error document: nothing said production had been stopped).
        doc = as_json(busy)
        assert (doc["schema"], doc["exit_code"], doc["ok"], doc["to"]) == ("ddtreectl.mode/1", 7, False, "dev"), doc
        assert doc["stopped"] is True and doc["gpus"]["verdict"] == "busy" and doc["lease"] is None, doc
        assert "is stopped and disabled" in doc["error"]["message"], doc
        assert host.systemctl("is-active", UNIT, check=False).stdout.strip() == "inactive"
        assert lease(host)["mode"] == "prod" and audit(host)[-1]["ok"] is False
    finally:
        host.sh(f"kill {stray}")  # the process the test started, by PID
    assert ddtreectl("-i", i, "mode", "md-race", "prod").returncode == 0

    # Two operators ask for the host at once: one wins, the other gets exit 8 naming the winner.
    runs: dict[str, subprocess.CompletedProcess[str]] = {}
    threads = [threading.Thread(target=lambda u=u: runs.__setitem__(
        u, ddtreectl("-i", i, "mode", "md-race", "dev", "--reason", f"{u}'s run", "--ttl", "3s", user=u)))
        for u in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(400)
    codes = sorted((r.returncode, u) for u, r in runs.items())
    assert [c for c, _ in codes] == [0, 8], {u: (r.returncode, r.stderr) for u, r in runs.items()}
    winner, loser = codes[0][1], codes[1][1]
    assert f"{winner}@" in runs[loser].stderr
    assert lease(host)["holder"].startswith(f"{winner}@")

    # The lease expires: reported as expired (mode, status), never taken over silently.
    time.sleep(4)
    shown = as_json(ddtreectl("-i", i, "mode", "md-race", "--json"))
    assert shown["lease"]["expired"] is True and shown["lease"]["holder"].startswith(f"{winner}@")
    status = ddtreectl("-i", i, "status", "md-race", "--json")
    assert as_json(status)["hosts"][0]["mode"]["expired"] is True
    table = ddtreectl("-i", i, "status", "md-race")
    assert f"mode dev: EXPIRED {winner}@" in table.stdout
    again = ddtreectl("-i", i, "mode", "md-race", "dev", "--reason", "mine now", user=loser)
    assert again.returncode == 8 and "EXPIRED" in again.stderr and "never taken over silently" in again.stderr
    stale = ddtreectl("-i", i, "run", "md-race", "--", "true", user=winner)
    assert stale.returncode == 8 and "expired" in stale.stderr
    forced = ddtreectl("-i", i, "mode", "md-race", "dev", "--reason", "mine now", "--force", user=loser)
    assert forced.returncode == 0, forced.stderr
    assert audit(host)[-1]["forced"] == [f"took over the lease of {lease_holder(runs, winner)}"]


def lease_holder(runs: dict[str, subprocess.CompletedProcess[str]], user: str) -> str:
    import socket

    return f"{user}@{socket.gethostname()}"
