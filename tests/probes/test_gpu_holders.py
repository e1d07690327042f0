"""The GPU-holder script on real local processes (it runs unchanged over SSH on hosts)."""

from __future__ import annotations

import subprocess
import sys

from ddtreectl.probes.gpu_holders import HOLDERS_SCRIPT, parse_holders


def test_a_command_line_with_newlines_stays_one_holder_with_its_whole_command() -> None:
    # `python -c` scripts carry newlines in argv; seen on the H200 as a truncated "python3 -c".
    proc = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(30)"])
    try:
        out = subprocess.run(["sh", "-c", HOLDERS_SCRIPT, "holders", str(proc.pid), "999999999"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        proc.kill()
        proc.wait()
    live, gone = parse_holders(out)
    assert live.pid == proc.pid and live.visible
    assert live.command.split()[1:] == ["-c", "import", "time", "time.sleep(30)"]
    assert live.describe().endswith("time.sleep(30)")
    assert gone.pid == 999999999 and not gone.visible and "not visible" in gone.describe()
