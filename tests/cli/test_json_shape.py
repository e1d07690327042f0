"""Every `--json` prints ONE document on stdout with the same envelope (README, "JSON output"), on
success and on failure alike: `schema` ddtreectl.<command>/1, `exit_code` equal to the process's exit
status, `error`; fan-out commands list EVERY targeted host under `hosts` in target order, each with
`host`, `ok` and `error`; single-host commands carry `host` and `ok` at the top level.

Through the INSTALLED console script, against a `transport: local` host (`box`, an nvidia-smi stand-in
printing an idle H200) and an SSH host on a closed loopback port (`dead`: connects are refused)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.cli.local_box import ddtreectl, make_local_box

REPO = Path(__file__).resolve().parents[2]


def _closed_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends: connects are refused


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("json-shape")
    _, root, env = make_local_box(tmp, "nvidia-smi-gpus-h200-1x.txt")
    shutil.copytree(REPO / "templates", tmp / "templates")  # render finds them beside the inventory
    inventory = tmp / "hosts.yaml"
    inventory.write_text(
        "services:\n  svc:\n    template: sglang-ddtree.service.j2\n    port: 30000\n"
        "    model_path: /models/x\n    served_model_name: x\n"
        f"hosts:\n  dead:\n    address: 127.0.0.1\n    port: {_closed_loopback_port()}\n    gpus: 0\n"
        "    connect_timeout: 2\n    role: prod\n    service: svc\n"
        f"  box:\n    transport: local\n    gpus: 1\n    remote_root: {root}\n")
    return str(inventory), env


def document(world: tuple[str, dict[str, str]], *args: str) -> tuple[int, dict[str, Any]]:
    inventory, env = world
    # `run HOST -- CMD`: --json goes before the `--` (after it, it would be part of CMD)
    cut = args.index("--") if "--" in args else len(args)
    run = ddtreectl(env, "-i", inventory, *args[:cut], "--json", *args[cut:])
    assert "Traceback" not in run.stderr, run.stderr
    try:
        doc = json.loads(run.stdout)  # exactly one JSON value, nothing else on stdout
    except ValueError:
        raise AssertionError(f"not one JSON document (exit {run.returncode}): {run.stdout!r}\n{run.stderr}") from None
    assert isinstance(doc, dict), doc
    assert doc["exit_code"] == run.returncode, (doc, run.stderr)
    assert doc["ok"] is (run.returncode == 0)
    assert "error" in doc
    if doc["error"] is not None:
        assert set(doc["error"]) == {"message", "hint", "exit_code"} and doc["error"]["exit_code"] == run.returncode
    return run.returncode, doc


def check_entry(entry: dict[str, Any]) -> None:
    assert isinstance(entry["host"], str) and isinstance(entry["ok"], bool)
    if entry["ok"]:
        assert entry["error"] is None, entry
    if entry["error"] is not None:
        assert entry["ok"] is False and set(entry["error"]) == {"message", "hint", "exit_code"}, entry
        assert entry["error"]["exit_code"] not in (0, None) and entry["error"]["message"]


FAN_OUT = [
    # (command, schema, targets, expected exit code, the hosts that fail with an error, and that error's code)
    (["status", "dead", "box"], "status", ["dead", "box"], 6, {"dead": 4}),
    # One host alone exits as a single-host command does (status said 6 where the others say 4).
    (["status", "dead"], "status", ["dead"], 4, {"dead": 4}),
    (["gpus", "dead", "box"], "gpus", ["dead", "box"], 6, {"dead": 4}),
    (["gpus", "dead"], "gpus", ["dead"], 4, {"dead": 4}),
    (["deploy", "--plan", "dead"], "deploy-plan", ["dead"], 4, {"dead": 4}),
    (["deploy", "dead"], "deploy", ["dead"], 4, {"dead": 4}),
    (["rollback", "-H", "dead"], "rollback", ["dead"], 4, {"dead": 4}),
    (["restore-service", "dead", "box"], "restore-service", ["dead", "box"], 6, {"dead": 4, "box": 3}),
    (["logs", "dead", "box"], "logs", ["dead", "box"], 6, {"dead": 4, "box": 3}),
]


@pytest.mark.parametrize("args,schema,targets,code,failed", FAN_OUT, ids=[" ".join(c[0]) for c in FAN_OUT])
def test_fan_out_commands_list_every_targeted_host(world: tuple[str, dict[str, str]], args: list[str], schema: str,
                                                   targets: list[str], code: int, failed: dict[str, int]) -> None:
    exit_code, doc = document(world, *args)
    assert (exit_code, doc["schema"], doc["error"]) == (code, f"ddtreectl.{schema}/1", None)
    assert [e["host"] for e in doc["hosts"]] == targets
    for entry in doc["hosts"]:
        check_entry(entry)
        if entry["host"] in failed:
            assert entry["ok"] is False and entry["error"]["exit_code"] == failed[entry["host"]], entry
        else:
            assert entry["ok"] is True, entry


SINGLE = [
    (["mode", "box"], "mode", "box", 0),
    (["mode", "dead"], "mode", "dead", 4),
    (["mode", "box", "dev"], "mode", "box", 2),  # no --reason: refused before anything runs
    (["render", "dead", "--diff"], "render-diff", "dead", 4),
    (["set-ip", "dead", "127.0.0.9"], "set-ip", "dead", 4),
    (["trust", "dead", "--yes"], "trust", "dead", 4),
    (["lock", "status", "box"], "lock-status", "box", 0),
    (["lock", "status", "dead"], "lock-status", "dead", 4),
    (["run", "box", "--", "true"], "run", "box", 7),  # nobody holds it for development
    (["run", "dead", "--", "true"], "run", "dead", 4),
]


@pytest.mark.parametrize("args,schema,host,code", SINGLE, ids=[" ".join(c[0]) for c in SINGLE])
def test_single_host_commands_carry_host_and_ok(world: tuple[str, dict[str, str]], args: list[str], schema: str,
                                                host: str, code: int) -> None:
    exit_code, doc = document(world, *args)
    assert (exit_code, doc["schema"], doc["host"], doc["ok"]) == (code, f"ddtreectl.{schema}/1", host, code == 0)
    assert (doc["error"] is None) == (code == 0)


@pytest.mark.parametrize("args,schema", [(["status", "nosuchhost"], "status"), (["deploy", "nosuchhost"], "deploy"),
                                         (["restore-service", "nosuchhost"], "restore-service"),
                                         (["gpus", "nosuchhost"], "gpus"), (["logs", "nosuchhost"], "logs")])
def test_a_command_that_fails_before_any_host_still_prints_its_document(
        world: tuple[str, dict[str, str]], args: list[str], schema: str) -> None:
    exit_code, doc = document(world, *args)
    assert (exit_code, doc["schema"], doc["hosts"], doc["ok"]) == (3, f"ddtreectl.{schema}/1", [], False)
    assert "'nosuchhost' is neither a host nor a group" in doc["error"]["message"] and doc["error"]["hint"]


def test_render_json_without_diff_is_refused_not_answered_with_a_unit_file(
        world: tuple[str, dict[str, str]]) -> None:
    """`render HOST --json` printed the unit text on stdout and exited 0: a script that asked for JSON
    got a systemd unit. Only `render --diff` has a document; without --diff, --json is a usage error."""
    inventory, env = world
    run = ddtreectl(env, "-i", inventory, "render", "dead", "--json")
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    doc = json.loads(run.stdout)  # the refusal's document (render-diff), not a unit file
    assert (doc["schema"], doc["host"], doc["error"]["exit_code"]) == ("ddtreectl.render-diff/1", "dead", 2), doc
    assert "[Service]" not in run.stdout
    assert "--json goes with --diff" in run.stderr and "ddtreectl render dead --diff --json" in run.stderr
    run = ddtreectl(env, "-i", inventory, "render", "dead")  # the text form is unchanged
    assert run.returncode == 0 and "[Service]" in run.stdout, run.stderr


@pytest.mark.parametrize("args,schema,words", [
    (["mode", "box", "foo"], "mode", "unknown mode"),
    (["mode", "box", "dev"], "mode", "--reason is required"),
    (["deploy"], "deploy", "name what to deploy"),
    (["rollback"], "rollback", "name what to roll back"),
    (["logs", "box", "-f"], "logs", "--json cannot follow"),
    (["render", "box"], "render-diff", "--json goes with --diff"),
])
def test_a_usage_error_of_ddtreectl_itself_is_a_document_too(
        world: tuple[str, dict[str, str]], args: list[str], schema: str, words: str) -> None:
    """Exit 2 raised by ddtreectl (not by Click's parser) comes with the command's document: `logs -f`
    and `render` without --diff printed nothing on stdout while `mode box foo` printed one."""
    exit_code, doc = document(world, *args)
    assert (exit_code, doc["schema"], doc["error"]["exit_code"]) == (2, f"ddtreectl.{schema}/1", 2), doc
    assert words in doc["error"]["message"] and doc["error"]["hint"], doc


@pytest.mark.parametrize("args", [["status", "--bogus"], ["gpus", "--samples", "0"], ["lock", "status"],
                                  ["run", "box"]])
def test_a_command_line_click_rejects_has_no_document(world: tuple[str, dict[str, str]], args: list[str]) -> None:
    """README: a command line Click rejects before the command runs exits 2 with nothing on stdout."""
    inventory, env = world
    run = ddtreectl(env, "-i", inventory, *args, "--json")
    assert (run.returncode, run.stdout) == (2, ""), (run.stdout, run.stderr)
    assert "Usage: ddtreectl" in run.stderr and "Traceback" not in run.stderr
