"""Warnings from facts vs the inventory's expectations (pure: facts built from fixtures)."""

from __future__ import annotations

from dataclasses import replace

from ddtreectl.inventory.models import Host
from ddtreectl.probes.checks import warnings_for
from ddtreectl.probes.facts import DiskState, HostFacts
from ddtreectl.probes.status import parse_status_output

from tests.probes.fixtures import fixture

HOST = Host(name="ct", address="10.0.0.1", gpus=8, service="fx")


def facts_with(gpus_fixture: str, apps_fixture: str = "", *, ms: int = 25,
               unit_fixture: str = "active") -> HostFacts:
    service = fixture(f"systemctl-{unit_fixture}.txt")
    text = (f"@@ddtree-begin meta\nhostname=ct\nmachine_id=abc\npid1=systemd\n@@ddtree-end meta rc=0 ms=0\n"
            f"@@ddtree-begin gpus\n{fixture(gpus_fixture)}@@ddtree-end gpus rc=0 ms={ms}\n"
            f"@@ddtree-begin apps\n{fixture(apps_fixture) if apps_fixture else ''}@@ddtree-end apps rc=0 ms=20\n"
            f"@@ddtree-begin service\n{service}@@ddtree-end service rc=0 ms=5\n"
            "@@ddtree-begin release\nroot=/opt/ddtree\nroot_exists=1\ncurrent_link=releases/r1\n"
            "current_path=/opt/ddtree/releases/r1\ncurrent_exists=1\nstamp=1\n@@ddtree-end release rc=0 ms=0\n"
            "@@ddtree-begin disk\nFilesystem 1024-blocks Used Available Capacity Mounted on\n"
            "/dev/nvme0n1p2 3750000000 1000000000 2750000000 27% /\n@@ddtree-end disk rc=0 ms=1\n")
    return parse_status_output(text, unit="fx.service")


def test_healthy_serving_host_has_no_warnings() -> None:
    facts = facts_with("nvidia-smi-gpus-rtxpro6000-8x-serving.txt", "nvidia-smi-apps-rtxpro6000-8x-serving.txt")
    assert warnings_for(HOST, facts) == []


def test_gpu_count_persistence_and_slowness() -> None:
    facts = facts_with("nvidia-smi-gpus-rtxpro6000-7of8-idle-pm-off.txt", ms=14000)
    assert warnings_for(HOST, facts) == [
        "expected 8 GPUs, found 7",
        "nvidia-smi slow (14000 ms; persistence mode off?)",
        "persistence mode off on GPU 0,1,2,3,4,5,6",
    ]


def test_failed_unit_identity_gpu_uuid_and_disk() -> None:
    facts = facts_with("nvidia-smi-gpus-h200-1x.txt", unit_fixture="failed")
    facts = replace(facts, disk=DiskState(path="/dev/vda", mount="/", total_kib=100 * 1024 * 1024,
                                          avail_kib=3 * 1024 * 1024, used_pct=97))
    host = replace(HOST, gpus=1, machine_id="other", gpu_uuids=("GPU-00000000-dead-beef-0000-000000000000",))
    assert warnings_for(host, facts) == [
        "machine-id abc differs from the recorded other: another machine answers at this address?",
        "1 recorded GPU UUID(s) not found (e.g. GPU-00000000-dead-beef-0000-000000000000): "
        "GPU swapped or another machine?",
        "disk low: 3.0 GiB free on / (97% used)",
    ]


def test_missing_nvidia_smi_only_matters_where_gpus_are_expected() -> None:
    local = parse_status_output(fixture("probe-local-nosystemd.txt"), unit=None)
    assert warnings_for(replace(HOST, gpus=0), local) == []
    assert warnings_for(HOST, local) == ["nvidia-smi missing (expected 8 GPUs)"]


def test_release_without_stamp_and_daemon_reload() -> None:
    facts = facts_with("nvidia-smi-gpus-h200-1x.txt", unit_fixture="need-reload")
    facts = replace(facts, release=replace(facts.release, build_stamp=False))
    assert warnings_for(replace(HOST, gpus=1), facts) == [
        "fx.service changed on disk: daemon-reload pending",
        "release r1 has no build stamp (build incomplete or failed)",
    ]


def test_a_production_host_whose_service_is_down_says_what_brings_it_back() -> None:
    """After a restart a `role: prod` host's service was shown as "stopped and disabled" with no
    warning and no next step: the one question status exists to answer. Now it warns with the
    command, unless the host is held for development on purpose (a dev lease)."""
    from ddtreectl.probes.facts import ServiceState

    prod = replace(HOST, role="prod", gpus=1)
    failed = facts_with("nvidia-smi-gpus-h200-1x.txt", unit_fixture="failed")
    assert warnings_for(prod, failed) == [
        "production service fx.service is not running: `ddtreectl restore-service ct` starts it and verifies "
        "it is healthy; `ddtreectl logs ct` shows why it failed"]
    assert warnings_for(replace(prod, role="dev"), failed) == []  # a dev host's service is its own business
    assert warnings_for(prod, facts_with("nvidia-smi-gpus-h200-1x.txt")) == []  # running: nothing to say
    stopped = replace(failed, service=ServiceState(unit="fx.service", known=True, load_state="loaded",
                                                   active_state="inactive", sub_state="dead",
                                                   unit_file_state="disabled", result="success"))
    assert warnings_for(prod, stopped) == [
        "production service fx.service is not running: `ddtreectl restore-service ct` starts it and verifies "
        "it is healthy"]
    lease = '{"mode": "dev", "holder": "alice@box", "reason": "bench", "since": 1, "expires": 4102444800}'
    assert warnings_for(prod, replace(stopped, state_files={"state/mode.json": lease})) == []
    missing = replace(stopped, service=ServiceState(unit="fx.service", known=True, load_state="not-found"))
    assert warnings_for(prod, missing) == [
        "production service fx.service is not installed: `ddtreectl deploy --host ct` installs it"]
