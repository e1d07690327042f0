"""Capture REAL `systemctl show` and probe output fixtures from a real systemd test host.

Run as root: `python3 -m tests.probes.capture` (boots one tests/testbed host, puts small units into
every state the status command must tell apart, writes tests/probes/fixtures/systemctl-*.txt and
probe-*.txt). Re-run it when systemd changes; the fixture tests then show what moved.
"""

from __future__ import annotations

import time
from pathlib import Path

from ddtreectl.probes.status import load_script
from tests.testbed import Fleet
from tests.testbed.host import TestHost

FIXTURES = Path(__file__).parent / "fixtures"
PROPS = ("LoadState,ActiveState,SubState,UnitFileState,Result,ExecMainStatus,NRestarts,"
         "ActiveEnterTimestamp,NeedDaemonReload,MainPID")

# name -> (unit file body or None for "no such unit", shell set-up after daemon-reload)
UNITS: dict[str, tuple[str | None, str]] = {
    "active": ("[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
               "systemctl enable --now {u}"),
    "activating": ("[Service]\nType=notify\nExecStart=/bin/sleep infinity\nTimeoutStartSec=infinity\n",
                   "systemctl start --no-block {u}"),
    "auto-restart": ("[Service]\nExecStart=/bin/sh -c 'exit 1'\nRestart=always\nRestartSec=2\n"
                     "StartLimitIntervalSec=0\n", "systemctl start --no-block {u}; sleep 5"),
    "failed": ("[Service]\nExecStart=/bin/sh -c 'exit 3'\nRestart=no\n"
               "[Install]\nWantedBy=multi-user.target\n",
               "systemctl enable {u}; systemctl start {u} || true"),
    "failed-after-restarts": ("[Service]\nExecStart=/bin/sh -c 'exit 1'\nRestart=on-failure\nRestartSec=100ms\n"
                    "[Unit]\nStartLimitIntervalSec=60\nStartLimitBurst=3\n",
                    "systemctl start --no-block {u}; sleep 3"),
    "stopped-enabled": ("[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
                        "systemctl enable {u}"),
    "stopped-disabled": ("[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
                         "true"),
    "stopped-disabled-after-exit": ("[Service]\nExecStart=/bin/sh -c 'exit 0'\n"
                                    "[Install]\nWantedBy=multi-user.target\n", "systemctl start {u}"),
    "static": ("[Service]\nExecStart=/bin/sleep infinity\n", "true"),
    "masked": ("[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
               "systemctl mask {u}"),
    "not-found": (None, "true"),
    "need-reload": ("[Service]\nExecStart=/bin/sleep infinity\n[Install]\nWantedBy=multi-user.target\n",
                    "systemctl enable --now {u}; "
                    "printf '[Service]\\nExecStart=/bin/sleep 1000\\n' > /etc/systemd/system/{u}"),
}


def _unit(name: str) -> str:
    return f"fx-{name}.service"


def install_units(host: TestHost) -> None:
    for name, (body, _) in UNITS.items():
        if body is not None:
            # `systemctl mask` needs /etc/systemd/system/UNIT free for its /dev/null link.
            where = "/usr/lib/systemd/system" if name == "masked" else "/etc/systemd/system"
            host.write_file(f"{where}/{_unit(name)}", body)
    host.systemctl("daemon-reload")
    for name, (_, setup) in UNITS.items():
        host.sh(setup.format(u=_unit(name)), timeout=60)


def capture(host: TestHost) -> None:
    stamp = "# Real output captured by `python3 -m tests.probes.capture` from a tests/testbed host\n"
    version = host.sh("systemctl --version | head -1").stdout.strip()
    for name in UNITS:
        unit = _unit(name)
        # The probe asks with --timestamp=unix; older systemd without it gets the human format.
        variants = [("--timestamp=unix", "")]
        if name in ("active", "failed", "auto-restart"):
            variants.append(("", "-human"))
        for flag, suffix in variants:
            out = host.sh(f"LC_ALL=C systemctl show {flag} -p {PROPS} -- {unit}").stdout
            (FIXTURES / f"systemctl-{name}{suffix}.txt").write_text(
                f"{stamp}# ({version}): systemctl show {flag} -p {PROPS} -- {unit}\n{out}")
    # An odd locale. systemd < 250 wrote the timestamp's weekday with the locale's strftime("%a");
    # this fixture records what the installed systemd does under de_DE.UTF-8.
    host.sh("localedef -i de_DE -f UTF-8 de_DE.UTF-8", timeout=120)
    unit = _unit("active")
    out = host.sh(f"LC_ALL=de_DE.UTF-8 systemctl show -p {PROPS} -- {unit}").stdout
    (FIXTURES / "systemctl-active-de_DE.txt").write_text(
        f"{stamp}# ({version}): LC_ALL=de_DE.UTF-8 systemctl show -p {PROPS} -- {unit}\n{out}")
    # The whole probe, as `status` runs it, for a failed unit with a deployed release.
    host.sh("mkdir -p /opt/ddtree/releases/r1 /opt/ddtree/releases/r2 /opt/ddtree/state && "
            "touch /opt/ddtree/releases/r2/.build-stamp && ln -sfn releases/r2 /opt/ddtree/current && "
            "printf '{\"owner\": \"ana\", \"mode\": \"dev\"}' > /opt/ddtree/state/mode.json")
    host.write_file("/tmp/status.sh", load_script("status.sh"))
    for name in ("failed", "active"):
        out = host.sh(f"sh -c \"$(cat /tmp/status.sh)\" ddtree-probe {_unit(name)} /opt/ddtree 10").stdout
        (FIXTURES / f"probe-testbed-{name}.txt").write_text(
            f"{stamp}# ({version}): status.sh {_unit(name)} /opt/ddtree 10\n{out}")


def main() -> None:
    with Fleet() as fleet:
        (host,) = fleet.boot(["fixture-capture"])
        started = time.monotonic()
        install_units(host)
        capture(host)
        print(f"captured {len(UNITS)} units in {time.monotonic() - started:.1f} s into {FIXTURES}")


if __name__ == "__main__":
    main()
