"""End-to-end: what `mode HOST dev` says about its GPU check before it changes anything, on real
systemd + sshd test hosts without a service profile (a bench box), through the INSTALLED CLI.

- On a `gpus: 0` host the switch sampled nvidia-smi once without a word (only hosts declaring GPUs
  said "checking ... that the GPUs can be verified idle"): now it says what it checks and how.
- A host without a service whose nvidia-smi lists a GPU the inventory does not declare is refused
  (exit 7), and the refusal said "so production was not stopped" on a host that runs no production.
  Now it says what was checked and that nothing was changed (no lease written), and the hint the
  next step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_mode import ddtreectl, nvidia_smi_stand_in

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]


@pytest.mark.testbed
def test_mode_dev_says_its_gpu_check_on_hosts_without_a_service(testbed: Any, boot_hosts: Any, tmp_path: Path) -> None:
    bare, extra = boot_hosts(["gw-bare", "gw-extra"], gpus_stub={"gw-extra": nvidia_smi_stand_in()})
    inventory = str(testbed.inventory([bare, extra], tmp_path / "hosts.yaml"))  # gpus: 0, no service

    took = ddtreectl("-i", inventory, "mode", "gw-bare", "dev", "--reason", "bench")
    assert took.returncode == 0, took.stdout + took.stderr
    assert ("gw-bare: checking, before anything is changed, that the host has no GPUs, as the inventory says "
            "(gpus: 0): one nvidia-smi query") in took.stderr, took.stderr

    refused = ddtreectl("-i", inventory, "mode", "gw-extra", "dev", "--reason", "bench")
    assert refused.returncode == 7, refused.stdout + refused.stderr
    err = " ".join(refused.stderr.split())  # Rich may wrap at 80 columns
    assert "production" not in err, err
    assert ("one nvidia-smi query shows its GPUs can never be verified idle (expected 0 GPUs, nvidia-smi listed 1); "
            "nothing was changed: no lease was written (gw-extra runs no service profile)") in err, err
    assert "hint: check gw-extra's GPUs" in err and "correct hosts.gw-extra.gpus in hosts.yaml" in err, err
    assert not (extra.root / "opt/ddtree/state/mode.json").exists()
