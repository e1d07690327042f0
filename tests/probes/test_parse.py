"""Section splitting, df, timestamps, releases and whole-probe parsing on real captured output."""

from __future__ import annotations

from ddtreectl.probes.parse import parse_df, parse_release, parse_timestamp, split_sections
from ddtreectl.probes.status import parse_status_output
from ddtreectl.probes.words import service_condition

from tests.probes.fixtures import fixture


def test_split_sections_keeps_rc_ms_missing_and_cut_output() -> None:
    text = ("login banner\n@@ddtree-begin a\nx=1\n@@ddtree-end a rc=3 ms=12\n"
            "@@ddtree-begin gpus\n@@ddtree-end gpus rc=127 ms=0 missing=1\n"
            "@@ddtree-begin file state/lock/owner\n{}\n\n@@ddtree-end file rc=0 ms=0\n"
            "@@ddtree-begin cut\npartial line")
    a, gpus, file, cut = split_sections(text)
    assert (a.name, a.body, a.rc, a.ms, a.missing) == ("a", "x=1", 3, 12, False)
    assert (gpus.rc, gpus.missing) == (127, True)
    assert (file.name, file.arg, file.body) == ("file", "state/lock/owner", "{}")
    assert (cut.name, cut.body, cut.rc) == ("cut", "partial line", None)


def test_df_german_locale_and_space_in_mount_point() -> None:
    disk = parse_df(fixture("df-de_DE.txt"))
    assert disk is not None
    assert (disk.path, disk.mount, disk.total_kib) == ("/dev/vda", "/", 264212084)
    assert disk.avail_kib > 0 and disk.used_pct is not None and 0 < disk.used_pct < 100
    spaced = parse_df(fixture("df-space-in-mount.txt"))
    assert spaced is not None
    assert (spaced.mount, spaced.total_kib, spaced.avail_kib, spaced.used_pct) == (
        "/tmp/ddtree probe dir", 65536, 65536, 0)
    assert parse_df("df: /nope: No such file or directory\n") is None


def test_timestamps_unix_utc_and_foreign_weekday() -> None:
    assert parse_timestamp("@1795979993") == 1795979993
    assert parse_timestamp("Sun 2026-11-29 19:19:53 UTC") == 1795979993
    assert parse_timestamp("So 2026-11-29 19:19:53 UTC") == 1795979993  # de_DE weekday
    assert parse_timestamp("Sun 2026-11-29 20:19:53 CET") is None  # zone we cannot resolve: unknown
    assert parse_timestamp("") is None and parse_timestamp("n/a") is None


def test_release_current_stamp_and_running_release() -> None:
    text = ("root=/opt/ddtree\nroot_exists=1\ncurrent_link=releases/20261129-1\n"
            "current_path=/opt/ddtree/releases/20261129-1\ncurrent_exists=1\nstamp=1\n"
            "release=20261128-3\nrelease=20261129-1\nmain_pid=4242\n"
            "main_exe=/opt/ddtree/releases/20261128-3/venv/bin/python3.11 (deleted)\n"
            "main_cwd=/\n")
    rel = parse_release(text)
    assert (rel.current, rel.build_stamp, rel.releases) == ("20261129-1", True, ("20261128-3", "20261129-1"))
    assert rel.running == "20261128-3" and rel.restart_pending
    same = parse_release(text.replace("20261128-3/venv", "20261129-1/venv"))
    assert same.running == "20261129-1" and not same.restart_pending
    bare = parse_release("root=/opt/ddtree\nroot_exists=0\n")
    assert (bare.root_exists, bare.current, bare.restart_pending) == (False, None, False)


def test_whole_probe_from_a_machine_without_systemd_or_gpus() -> None:
    facts = parse_status_output(fixture("probe-local-nosystemd.txt"), unit="sglang-k26-ddtree.service")
    assert facts.hostname == "vm" and len(facts.machine_id) == 32 and facts.uptime_s is not None
    assert facts.gpus.status == "missing"
    assert facts.service is not None and not facts.service.known
    assert service_condition(facts.service).words == (
        "unknown: systemd is not running (PID 1 is process_api)")
    assert not facts.release.root_exists and facts.release.current is None
    assert facts.disk is not None and facts.disk.mount == "/"
