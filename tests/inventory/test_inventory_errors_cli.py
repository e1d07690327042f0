"""Inventory errors as users meet them: the shipped inventory loaded with no network, every bad case
through the CLI's error boundary (exit 3, no traceback), and randomly mutated inventories raising
only InventoryError. The loader's own cases are in test_loader.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddtreectl.errors import InventoryError

from tests.inventory.test_loader import REPO, SHIPPED, write


# ---- the shipped inventory, isolated from the network ------------------------------------------


def test_shipped_inventory_loads_without_a_network() -> None:
    """Loads the shipped file (ct200 in scope) in a process that has no network at all."""
    code = (
        "from pathlib import Path; from ddtreectl.inventory.loader import load;"
        f"inv = load(Path({str(SHIPPED)!r})); print(sorted(inv.hosts))"
    )
    proc = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", code],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    if proc.returncode != 0 and "unshare" in proc.stderr and "Operation not permitted" in proc.stderr:
        pytest.skip("unshare --net needs privileges here")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['ct200', 'local']"


# ---- through the CLI's error boundary -----------------------------------------------------------
# Every address below is loopback: if a case ever loaded by mistake, `status` would stay local.

CLI_CASES = [
    ("hosts:\n  ct200:\n    address: 127.0.0.\n",
     "error: hosts.yaml:3: hosts.ct200.address: '127.0.0.' is not an IP address or hostname"),
    ("hosts:\n  a: {address: 127.0.0.2}\n  a: {address: 127.0.0.3}\n",
     "error: hosts.yaml:3: hosts.a: duplicate key 'a' (first defined at line 2)"),
    ("hosts:\n  a: {address: 127.0.0.2, prot: 22}\n",
     "error: hosts.yaml:2: hosts.a.prot: unknown key 'prot' (did you mean 'port'?)"),
    ("hosts:\n  a: {address: 127.0.0.2, port: 70000}\n",
     "error: hosts.yaml:2: hosts.a.port: 70000 is out of range 1..65535"),
    ("hosts:\n  a: {address: 127.0.0.2}\ngroups:\n  g: [a, b]\n",
     "error: hosts.yaml:4: groups.g[1]: group 'g' names unknown host 'b'"),
    ("hosts:\n  a: {address: 127.0.0.2, service: nope}\n",
     "error: hosts.yaml:2: hosts.a.service: unknown service profile 'nope'"),
    ("hosts:\n  a: {address: 127.0.0.2\n",
     "error: hosts.yaml:3:1: malformed YAML: while parsing a flow mapping did not find expected ',' or '}'"),
    ("hosts:\n  a:\n  \taddress: 127.0.0.2\n",  # a tab, which the message did not name
     "error: hosts.yaml:3:3: malformed YAML: a tab in the indentation (while scanning for the next token found "
     "character that cannot start any token)"),
]


@pytest.mark.parametrize(("text", "first_line"), CLI_CASES)
def test_cli_reports_inventory_errors_with_exit_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, first_line: str
) -> None:
    from ddtreectl.cli.main import run

    write(tmp_path, text)
    os.chdir(tmp_path)
    code = run(["-i", "hosts.yaml", "status", "--json"])
    out, err = capsys.readouterr()
    assert code == 3
    # --json: stdout is the one document, saying what stderr says (README, "JSON output")
    assert json.loads(out) == {"schema": "ddtreectl.status/1", "exit_code": 3, "ok": False, "hosts": [],
                               "error": {"message": first_line.removeprefix("error: "),
                                         "hint": err.splitlines()[-1].removeprefix("hint: "), "exit_code": 3}}
    lines = err.splitlines()
    assert lines[0] == first_line
    assert lines[-1].startswith("hint: ")
    assert "Traceback" not in err


def test_tab_in_the_indentation_is_named_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An editor shows a tab as spaces; PyYAML's message for it ("found character that cannot start any
    token", or "a tab character that violates indentation") named neither the tab nor what to do."""
    from ddtreectl.cli.main import run

    for text, line in (("hosts:\n  a:\n\taddress: 127.0.0.2\n", 3), ("hosts:\n\ta: {address: 127.0.0.2}\n", 2),
                       ("hosts:\n  a: {address: 127.0.0.2}\n\t# a comment\n", 3)):
        write(tmp_path, text)
        assert run(["-i", str(tmp_path / "hosts.yaml"), "validate"]) == 3
        first, hint = capsys.readouterr().err.splitlines()
        assert first.startswith(f"error: {tmp_path}/hosts.yaml:{line}:") and "a tab in the indentation" in first, first
        assert hint == (f"hint: YAML indents with spaces only: replace the tab(s) at the start of line {line} with "
                        "spaces, aligned with the lines around it"), hint
    write(tmp_path, "hosts:\n  a:\n    address:\t127.0.0.2\n")  # a tab after the colon is YAML's space
    assert run(["-i", str(tmp_path / "hosts.yaml"), "validate"]) == 0


@pytest.mark.parametrize(("argv", "first_line"), [
    (["status", "gpu-nod1"], "error: hosts.yaml: 'gpu-nod1' is neither a host nor a group (did you mean 'gpu-node1'?)"),
    (["gpus", "trainig"], "error: hosts.yaml: 'trainig' is neither a host nor a group (did you mean 'training'?)"),
    (["status", "al"], "error: hosts.yaml: 'al' is neither a host nor a group (did you mean 'all'?)"),
    (["mode", "gpu-nde1"], "error: hosts.yaml: no host named 'gpu-nde1' (did you mean 'gpu-node1'?) "
                           "(known: gpu-node1, gpu-node2)"),
    (["status", "zzz"], "error: hosts.yaml: 'zzz' is neither a host nor a group"),
])
def test_a_mistyped_target_gets_the_closest_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], first_line: str
) -> None:
    """Unknown inventory keys got "did you mean"; a mistyped host or group on the command line did not."""
    from ddtreectl.cli.main import run

    write(tmp_path, "hosts:\n  gpu-node1: {address: 127.0.0.2}\n  gpu-node2: {address: 127.0.0.3}\n"
                    "groups:\n  training: [gpu-node1]\n")
    assert run(["-i", str(tmp_path / "hosts.yaml"), *argv]) == 3
    assert capsys.readouterr().err.splitlines()[0] == first_line


@pytest.mark.parametrize("argv", [["status"], ["gpus"], ["deploy", "all", "--plan"], ["deploy", "all"],
                                  ["rollback", "all"], ["status", "g"], ["gpus", "g"], ["deploy", "--group", "g"],
                                  ["rollback", "g"], ["logs", "g"]], ids=" ".join)
def test_no_host_to_act_on_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """An empty group, or an inventory without hosts: status printed an empty table, gpus and `deploy --plan`
    nothing, and `deploy GROUP` exited 0 having deployed nowhere."""
    from ddtreectl.cli.main import run

    group = argv[-1] == "g"
    write(tmp_path, "hosts:\n  a: {address: 127.0.0.2}\ngroups:\n  g: []\n" if group else "hosts: {}\n")
    assert run(["-i", str(tmp_path / "hosts.yaml"), *argv]) == 3
    first, hint = capsys.readouterr().err.splitlines()
    assert first == ("error: hosts.yaml: group 'g' is empty: no host to act on" if group
                     else "error: hosts.yaml: the inventory has no hosts: no host to act on"), first
    assert hint == (f"hint: list host names under groups.g in {tmp_path}/hosts.yaml" if group
                    else f"hint: add hosts under hosts: in {tmp_path}/hosts.yaml"), hint


def test_validate_renders_every_host_unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped template name, or a template variable no profile gives, passed `validate` (exit 0) and
    failed at `render` or `deploy`. Rendering is local, as `render HOST` is: no host is contacted."""
    from ddtreectl.cli.main import run

    profile = ("services:\n  svc:\n    template: {}\n    port: 30000\n    model_path: /m\n"
               "    served_model_name: m\nhosts:\n  a: {{address: 127.0.0.2, service: svc}}\n")
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates/own.service.j2").write_text("[Service]\nExecStart={{ no_such_variable }}\n")
    cases = [("sglang-ddtree.service.j", "error: a: template 'sglang-ddtree.service.j' not found in"),
             ("own.service.j2", "error: a: rendering own.service.j2 for service 'svc': 'no_such_variable' is undefined")]
    for template, first in cases:
        write(tmp_path, profile.format(template))
        assert run(["-i", str(tmp_path / "hosts.yaml"), "validate"]) == 3
        assert capsys.readouterr().err.startswith(first)
    shutil.copy(REPO / "templates/sglang-ddtree.service.j2", tmp_path / "templates/own.service.j2")
    shutil.copy(REPO / "templates/sglang-ddtree.config.yaml.j2", tmp_path / "templates")
    assert run(["-i", str(tmp_path / "hosts.yaml"), "validate"]) == 0, capsys.readouterr().err


def test_cli_missing_inventory_via_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddtreectl.cli.main import run

    monkeypatch.setenv("DDTREECTL_INVENTORY", str(tmp_path / "gone.yaml"))
    assert run(["status"]) == 3
    assert capsys.readouterr().err.splitlines()[0] == (
        f"error: {tmp_path}/gone.yaml: inventory file not found (from $DDTREECTL_INVENTORY)")


def test_installed_command_exit_code_without_network(tmp_path: Path) -> None:
    """The real entry point, in a process without a network: file:line message, exit 3, no traceback."""
    write(tmp_path, "hosts:\n  ct200:\n    address: 10.1.230.\n")
    proc = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", "from ddtreectl.cli.main import main; main()",
         "-i", "hosts.yaml", "status"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        "error: hosts.yaml:3: hosts.ct200.address: '10.1.230.' is not an IP address or hostname"
    )
    assert "Traceback" not in proc.stderr


def test_mutated_inventories_raise_only_inventory_errors() -> None:
    """Seeded random damage to the shipped file: the loader either loads it or raises
    InventoryError with a file:line message; never another exception (a traceback for the user)."""
    import random

    from ddtreectl.inventory.loader import parse

    base = SHIPPED.read_text().replace("groups:", (
        "  extra: &x {address: 127.0.0.9, gpus: 1, jump_host: ct200}\n"
        "  other:\n    <<: *x\n    address: 127.0.0.8\ngroups:"))
    tokens = ["[]", "{}", "null", "~", "-1", "0", "70000", "yes", "'x'", "[a, b]", "{a: 1}", "*x", "&y",
              "!!str", "!foo", ":", "- ", "\t", "<<: *x", "1.5", '"\\u0000"', "|\n  text\n"]
    rng = random.Random(11)
    failures = 0
    for _ in range(3000):
        lines = base.splitlines()
        for _ in range(rng.randint(1, 3)):
            j = rng.randrange(len(lines))
            op = rng.random()
            if op < 0.5 and ":" in lines[j]:
                lines[j] = lines[j][: lines[j].index(":") + 1] + " " + rng.choice(tokens)
            elif op < 0.7:
                del lines[j]
            elif op < 0.85:
                lines.insert(j, lines[rng.randrange(len(lines))])
            else:
                lines[j] = " " * rng.randint(0, 6) + lines[j].strip()
        try:
            parse("\n".join(lines) + "\n", Path("hosts.yaml"))
        except InventoryError as err:
            assert str(err).startswith("hosts.yaml:"), str(err)
            failures += 1
    assert failures > 1000  # most mutations are errors; each one was reported, not crashed


def test_a_scoped_address_is_named_by_validate_and_status(tmp_path: Path) -> None:
    """A scoped IPv6 address in the file (set-ip refuses to write one): `validate` fails (3) naming file,
    line and host; `status` (and every other command) warns the same way on stderr and keeps working
    for the other hosts, and the host's JSON entry carries the warning. `%nosuchif0` names no interface
    of this machine: resolving it fails before any packet is sent."""
    from ddtreectl.cli.main import run

    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  here:\n    transport: local\n    remote_root: {tmp_path}/root\n"
                    "  far:\n    address: fe80::1%nosuchif0\n    connect_timeout: 2\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "import sys; from ddtreectl.cli.main import main; main()",
                               "-i", str(path), *args], capture_output=True, text=True, timeout=120, env=env)

    warning = (f"warning: {path}:6: hosts.far.address: 'fe80::1%nosuchif0' carries a zone index (%nosuchif0), "
               "which names a network interface of the machine it is typed on")
    hint = "hint: fe80::1 is link-local and cannot be reached without a zone: give far's global"
    checked = cli("validate")
    assert checked.returncode == 3 and checked.stdout == "", checked
    assert checked.stderr.startswith(warning) and hint in checked.stderr, checked.stderr
    assert f"error: {path}: 1 warning above" in checked.stderr, checked.stderr
    status = cli("status", "--json")
    assert status.returncode == 6, status
    assert status.stderr.startswith(warning) and hint in status.stderr, status.stderr
    far = {h["name"]: h for h in json.loads(status.stdout)["hosts"]}["far"]
    assert far["warnings"][0].startswith(warning.removeprefix("warning: ")), far
    assert run(["-i", str(path), "validate"]) == 3
    path.write_text(path.read_text().replace("fe80::1%nosuchif0", "10.0.0.1"))
    assert run(["-i", str(path), "validate"]) == 0
