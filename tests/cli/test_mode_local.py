"""`ddtreectl mode` and `run` through the INSTALLED console script on a `transport: local` host with no
service (the GPU is an `nvidia-smi` stand-in printing fixture output). The full switch with a real
service, sshd and systemd is tests/e2e/test_mode.py; this covers usage errors and the lease on a box
that only ever does development."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.local_box import ddtreectl, make_local_box


@pytest.fixture
def box(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    return make_local_box(tmp_path, "nvidia-smi-gpus-h200-1x.txt")


def test_usage_errors(box: tuple[Path, Path, dict[str, str]]) -> None:
    inventory, _, env = box
    i = str(inventory)
    assert ddtreectl(env, "-i", i, "mode", "box", "dev").returncode == 2  # --reason is required
    bad_ttl = ddtreectl(env, "-i", i, "mode", "box", "dev", "--reason", "x", "--ttl", "soon")
    assert bad_ttl.returncode == 2 and "'soon' is not a duration" in bad_ttl.stderr
    assert ddtreectl(env, "-i", i, "mode", "box", "maintenance").returncode == 2
    assert ddtreectl(env, "-i", i, "mode", "nobox").returncode == 3


def test_dev_run_prod_on_a_box_without_service(box: tuple[Path, Path, dict[str, str]]) -> None:
    inventory, root, env = box
    i = str(inventory)
    assert ddtreectl(env, "-i", i, "run", "box", "--", "true").returncode == 7
    dev = ddtreectl(env, "-i", i, "mode", "box", "dev", "--reason", "profile kernels", "--ttl", "30m", "--json")
    assert dev.returncode == 0, dev.stderr
    result = json.loads(dev.stdout)
    assert result["gpus"]["verdict"] == "idle" and result["lease"]["holder"].startswith("carol@")
    ran = ddtreectl(env, "-i", i, "run", "box", "--", "sh", "-c", "pwd -P; exit 4")
    assert ran.returncode == 4 and ran.stdout.strip() == str(root / "releases" / "r1")
    as_json = ddtreectl(env, "-i", i, "run", "box", "--json", "--", "sh", "-c", "echo out; echo err >&2; exit 4")
    doc = json.loads(as_json.stdout)
    assert as_json.returncode == 4 and (doc["schema"], doc["exit_code"], doc["ok"], doc["error"]) == \
        ("ddtreectl.run/1", 4, False, None), doc
    assert (doc["host"], doc["command_exit_code"], doc["output"]) == ("box", 4, ["out", "err"]), doc
    cut = ddtreectl(env, "-i", i, "run", "box", "--json", "--timeout", "2", "--",
                    "sh", "-c", "echo before; printf partial; sleep 30")
    doc = json.loads(cut.stdout)  # one document, with what ran before the kill
    assert cut.returncode == 5 and (doc["exit_code"], doc["timed_out"], doc["command_exit_code"]) == (5, True, None)
    assert doc["output"] == ["before", "partial"] and "ran past --timeout 2 s" in doc["error"]["message"], doc
    forced = ddtreectl({**env, "USER": "dave"}, "-i", i, "run", "box", "--force", "--", "true")
    assert forced.returncode == 0
    prod = ddtreectl(env, "-i", i, "mode", "box", "prod", "--json")
    assert prod.returncode == 0 and json.loads(prod.stdout)["lease"]["mode"] == "prod"
    log = [json.loads(line) for line in (root / "state" / "audit.log").read_text().splitlines()]
    assert [(a["action"], a.get("to")) for a in log] == [("mode", "dev"), *[("run", None)] * 4, ("mode", "prod")]
    assert log[4]["by"].startswith("dave@") and "not yours" in log[4]["forced"]
