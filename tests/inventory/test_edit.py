"""Round-trip edits: exactly the one line changes, byte for byte, and the inventory reads it back."""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path

import pytest

from ddtreectl.errors import InventoryError
from ddtreectl.inventory.edit import diff, edit_host, read_text, render, set_host_value, write_atomic
from ddtreectl.inventory.loader import load, parse

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHqTY0Yb5LXTHgq8sV7bdqvnqSq8Rzt+nH1j3EBo+Kx2"
MID = "0123456789abcdef0123456789abcdef"
UUIDS = ("GPU-8f1c2a3b-1111-2222-3333-444455556666", "GPU-9e0d1c2b-7777-8888-9999-000011112222")

COMMENTS = """\
\ufeff# ddtreectl inventory — comments everywhere (é, ✓) before the edited value
defaults:   # trailing comment on a section
  user: root  # root user
  port: 22


services:
  svc:  # profile
    template: t.j2
    port: 30000
    model_path: /models/m  # the same text as nothing else
    served_model_name: m

hosts:
  # a comment before ct200: 10.1.2.200
  ct200:
    address: "10.1.2.200"   # old VLAN; double-quoted on purpose
    gpus: 8
    role: prod
    service: svc
    host_key: null  # pin with `ddtreectl trust ct200`

  other:
    address: '10.1.2.201'
    # trailing comment inside a host
  twin:
    address: 10.1.2.202  # twin
groups:
  # group comment
  prod: [ct200]   # only ct200
"""

FLOW = """\
hosts:
  ct200: {address: 1.2.3.4, gpus: 8}
  spare: { address: 1.2.3.5 }
  empty-ish: {address: 1.2.3.6}
groups: {all-gpu: [ct200, spare]}
"""

ANCHORS = """\
defaults: &defs
  user: root
hosts:
  a: &gpu_box
    address: 10.0.0.1
    gpus: 8
    role: prod
  b:
    <<: *gpu_box
    address: 10.0.0.2
  c:
    address: &shared 10.0.0.3
  d:
    address: *shared
    port: 2222
"""

TWICE = """\
hosts:
  a:
    address: 10.0.0.5
    port: 22
  b:
    address: 10.0.0.5
    port: 22
"""

BLOCK_LIST = """\
hosts:
  box:
    address: 10.0.0.9
    gpu_uuids:
      - GPU-00000000-0000-0000-0000-000000000000
    role: dev
"""


def changed_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """(removed, added) lines, compared with their line endings."""
    removed, added = [], []
    for line in difflib.ndiff(old.splitlines(keepends=True), new.splitlines(keepends=True)):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed, added


def edit(text: str, host: str, tmp_path: Path, **values: object) -> str:
    return edit_host(text, tmp_path / "hosts.yaml", host, values)  # type: ignore[arg-type]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_replace_quoted_address_among_comments(tmp_path: Path, eol: str) -> None:
    old = COMMENTS.replace("\n", eol)
    new = edit(old, "ct200", tmp_path, address="10.1.230.171")
    removed, added = changed_lines(old, new)
    assert removed == [f'    address: "10.1.2.200"   # old VLAN; double-quoted on purpose{eol}']
    assert added == [f'    address: "10.1.230.171"   # old VLAN; double-quoted on purpose{eol}']
    # everything else byte for byte: the only difference is the scalar itself
    assert new.replace('"10.1.230.171"', '"10.1.2.200"') == old
    assert parse(new, Path("hosts.yaml")).hosts["ct200"].address == "10.1.230.171"


def test_single_quoted_and_plain_styles_are_kept(tmp_path: Path) -> None:
    new = edit(COMMENTS, "other", tmp_path, address="10.9.9.9")
    assert changed_lines(COMMENTS, new) == (["    address: '10.1.2.201'\n"], ["    address: '10.9.9.9'\n"])
    new = edit(COMMENTS, "twin", tmp_path, address="twin.example.com")
    assert changed_lines(COMMENTS, new) == (
        ["    address: 10.1.2.202  # twin\n"], ["    address: twin.example.com  # twin\n"]
    )


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_insert_missing_keys_with_indent_and_line_ending(tmp_path: Path, eol: str) -> None:
    old = COMMENTS.replace("\n", eol)
    new = edit(old, "other", tmp_path, host_key=KEY)
    assert changed_lines(old, new) == ([], [f"    host_key: {KEY}{eol}"])
    lines = new.split(eol)
    assert lines[lines.index("    address: '10.1.2.201'") + 1] == f"    host_key: {KEY}"
    reloaded = parse(new, Path("hosts.yaml"))
    assert reloaded.hosts["other"].host_key == KEY
    assert reloaded.hosts["twin"].line == parse(old, Path("hosts.yaml")).hosts["twin"].line + 1


def test_trust_replaces_null_and_inserts_identity(tmp_path: Path) -> None:
    new = edit(COMMENTS, "ct200", tmp_path, host_key=KEY, machine_id=MID, gpu_uuids=UUIDS)
    removed, added = changed_lines(COMMENTS, new)
    assert removed == ["    host_key: null  # pin with `ddtreectl trust ct200`\n"]
    assert added == [
        f"    host_key: {KEY}  # pin with `ddtreectl trust ct200`\n",
        f"    machine_id: {MID}\n",
        f"    gpu_uuids: [{UUIDS[0]}, {UUIDS[1]}]\n",
    ]
    host = parse(new, Path("hosts.yaml")).hosts["ct200"]
    assert (host.host_key, host.machine_id, host.gpu_uuids) == (KEY, MID, UUIDS)


def test_key_inherited_from_defaults_is_inserted_in_the_host(tmp_path: Path) -> None:
    new = edit(COMMENTS, "twin", tmp_path, port=2222)
    assert changed_lines(COMMENTS, new) == ([], ["    port: 2222\n"])
    inv = parse(new, Path("hosts.yaml"))
    assert inv.hosts["twin"].port == 2222 and inv.hosts["ct200"].port == 22


def test_flow_style_mapping(tmp_path: Path) -> None:
    new = edit(FLOW, "ct200", tmp_path, address="10.1.230.171")
    assert changed_lines(FLOW, new) == (
        ["  ct200: {address: 1.2.3.4, gpus: 8}\n"], ["  ct200: {address: 10.1.230.171, gpus: 8}\n"]
    )
    new = edit(FLOW, "spare", tmp_path, host_key=KEY)
    assert changed_lines(FLOW, new)[1] == [f"  spare: {{ address: 1.2.3.5, host_key: {KEY} }}\n"]
    assert parse(new, Path("h")).hosts["spare"].host_key == KEY
    new = edit(FLOW, "empty-ish", tmp_path, gpu_uuids=UUIDS)
    assert changed_lines(FLOW, new)[1] == [f"  empty-ish: {{address: 1.2.3.6, gpu_uuids: [{UUIDS[0]}, {UUIDS[1]}]}}\n"]


def test_value_that_appears_twice_only_the_right_one_changes(tmp_path: Path) -> None:
    new = edit(TWICE, "b", tmp_path, address="10.0.0.6")
    assert new == TWICE.replace("  b:\n    address: 10.0.0.5", "  b:\n    address: 10.0.0.6")
    inv = parse(new, Path("h"))
    assert (inv.hosts["a"].address, inv.hosts["b"].address) == ("10.0.0.5", "10.0.0.6")
    new = edit(COMMENTS, "ct200", tmp_path, address="10.1.2.201")  # equal to another host's value
    assert changed_lines(COMMENTS, new)[0] == ['    address: "10.1.2.200"   # old VLAN; double-quoted on purpose\n']


def test_anchors_merges_and_aliases(tmp_path: Path) -> None:
    # a host that merges an anchored mapping: its own address is explicit, so it changes alone
    new = edit(ANCHORS, "b", tmp_path, address="10.0.0.20")
    assert changed_lines(ANCHORS, new) == (["    address: 10.0.0.2\n"], ["    address: 10.0.0.20\n"])
    # a key b inherits through the merge is inserted into b, leaving the anchor alone
    new = edit(ANCHORS, "b", tmp_path, gpus=4)
    assert changed_lines(ANCHORS, new) == ([], ["    gpus: 4\n"])
    inv = parse(new, Path("h"))
    assert (inv.hosts["a"].gpus, inv.hosts["b"].gpus) == (8, 4)
    # the anchored host's own address is overridden in b, so only a changes
    new = edit(ANCHORS, "a", tmp_path, address="10.0.0.10")
    assert changed_lines(ANCHORS, new) == (["    address: 10.0.0.1\n"], ["    address: 10.0.0.10\n"])
    assert "&gpu_box" in new and "<<: *gpu_box" in new


def test_alias_value_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as info:
        edit(ANCHORS, "d", tmp_path, address="10.0.0.4")
    assert str(info.value) == (
        f"{tmp_path}/hosts.yaml:14: hosts.d.address: the value is an alias of the one defined at line 12; "
        "changing it would change every place that uses it"
    )
    assert info.value.exit_code == 3


def test_anchored_value_shared_with_another_host_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"changing hosts.c would also change d"):
        edit(ANCHORS, "c", tmp_path, address="10.0.0.4")
    with pytest.raises(InventoryError, match=r"changing hosts.a would also change b"):
        edit(ANCHORS, "a", tmp_path, gpus=2)
    # the anchor itself survives a permitted edit of the anchored scalar's host elsewhere
    new = set_host_value(ANCHORS, "c", "address", "10.0.0.4")
    assert "address: &shared 10.0.0.4\n" in new


def test_block_list_is_replaced(tmp_path: Path) -> None:
    new = edit(BLOCK_LIST, "box", tmp_path, gpu_uuids=UUIDS)
    assert new == BLOCK_LIST.replace(
        ":\n      - GPU-00000000-0000-0000-0000-000000000000", f": [{UUIDS[0]}, {UUIDS[1]}]"
    )
    assert parse(new, Path("h")).hosts["box"].gpu_uuids == UUIDS


def test_bad_edits_raise_and_unknown_host(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"hosts.ct200.address: '10.1.230.' is not an IP address"):
        edit(COMMENTS, "ct200", tmp_path, address="10.1.230.")
    with pytest.raises(InventoryError, match=r"no host named 'ct201'"):
        edit(COMMENTS, "ct201", tmp_path, address="10.0.0.1")


def test_render_quotes_only_when_needed() -> None:
    assert render("10.0.0.1", style=None, flow=False) == "10.0.0.1"
    assert render("fe80::1", style=None, flow=False) == "fe80::1"
    assert render("yes", style=None, flow=False) == "'yes'"  # would read back as a boolean
    assert render("123", style=None, flow=False) == "'123'"
    assert render("a, b", style=None, flow=True) == "'a, b'"
    assert render("it's", style="'", flow=False) == "'it''s'"
    assert render('say "hi"', style='"', flow=False) == '"say \\"hi\\""'
    assert render(None, style=None, flow=False) == "null"


def test_write_atomic_keeps_bytes_mode_owner_and_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    real.write_bytes(COMMENTS.replace("\n", "\r\n").encode())
    real.chmod(0o640)
    if os.geteuid() == 0:
        os.chown(real, 65534, 65534)
    link = tmp_path / "hosts.yaml"
    link.symlink_to(real)
    old = read_text(link)
    assert "\r\n" in old
    new = edit_host(old, link, "ct200", {"address": "10.1.230.171"})
    write_atomic(link, new)
    assert link.is_symlink() and read_text(real) == new
    assert real.read_bytes() == new.encode()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    if os.geteuid() == 0:
        assert (real.stat().st_uid, real.stat().st_gid) == (65534, 65534)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml", "real.yaml"]  # no temp left
    assert load(link).hosts["ct200"].address == "10.1.230.171"


def test_diff_shows_the_one_line() -> None:
    new = COMMENTS.replace('"10.1.2.200"', '"10.1.230.171"')
    text = diff(COMMENTS, new, "hosts.yaml")
    assert text.startswith("--- a/hosts.yaml\n+++ b/hosts.yaml\n")
    assert [ln for ln in text.splitlines() if ln[:1] in "+-" and ln[:3] not in ("---", "+++")] == [
        '-    address: "10.1.2.200"   # old VLAN; double-quoted on purpose',
        '+    address: "10.1.230.171"   # old VLAN; double-quoted on purpose',
    ]


def test_shipped_inventory_round_trip(tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "hosts.yaml"
    old = read_text(shipped)
    new = edit_host(old, shipped, "ct200", {"address": "10.1.2.200"})
    assert changed_lines(old, new) == (["    address: 10.1.230.171\n"], ["    address: 10.1.2.200\n"])


def test_insert_after_a_trailing_block_list_and_at_eof_without_newline(tmp_path: Path) -> None:
    text = "hosts:\n  box:\n    address: 10.0.0.9\n    gpu_uuids:\n    - " + UUIDS[0] + "\n  # next\n  other: {address: 10.0.0.8}"
    new = edit(text, "box", tmp_path, host_key=KEY)
    assert changed_lines(text, new) == ([], [f"    host_key: {KEY}\n"])
    assert new.index("host_key") > new.index(UUIDS[0]) and new.index("host_key") < new.index("# next")
    new = edit(text, "other", tmp_path, gpus=2)
    assert new == text.replace("10.0.0.8}", "10.0.0.8, gpus: 2}")
    eof = "hosts:\n  box:\n    address: 10.0.0.9"
    new = edit(eof, "box", tmp_path, role="prod")
    assert new == eof + "\n    role: prod"
    assert parse(new, Path("h")).hosts["box"].role == "prod"


def test_random_valid_inventories_edit_by_exactly_one_line(tmp_path: Path) -> None:
    """Seeded mutations of an awkward inventory: every edit the editor accepts changes one line
    (plus, for a replacement, removes one), keeps the line ending, and reads back as written."""
    import random

    base = COMMENTS.replace("groups:", (
        "  extra: &x {address: \"10.0.0.9\", gpus: 1, jump_host: ct200}   # c\n"
        "  merged:\n    <<: *x\n    address: '10.0.0.8'\n"
        "  flow: { address: 10.0.0.7 }\ngroups:"))
    tokens = ["[]", "{}", "null", "-1", "yes", "'x'", '"10.0.0.5"', "10.0.0.5", "&a 10.0.0.6", "# c",
              "{address: 10.0.0.4}", "{address: 10.0.0.4, <<: *x}"]
    rng = random.Random(7)
    accepted = 0
    for _ in range(800):
        lines = base.splitlines()
        for _ in range(rng.randint(0, 2)):
            j = rng.randrange(len(lines))
            if ":" in lines[j] and rng.random() < 0.7:
                lines[j] = lines[j][: lines[j].index(":") + 1] + " " + rng.choice(tokens)
            else:
                lines.insert(j, lines[rng.randrange(len(lines))])
        eol = rng.choice(["\n", "\r\n"])
        text = eol.join(lines) + eol
        try:
            inv = parse(text, Path("h.yaml"))
        except InventoryError:
            continue
        host = rng.choice(list(inv.hosts))
        key, value = rng.choice([("address", "10.9.8.7"), ("host_key", KEY), ("gpus", 3), ("machine_id", MID)])
        try:
            new = edit_host(text, Path("h.yaml"), host, {key: value})
        except InventoryError:
            continue  # refused (alias, shared anchor): the point is it never half-edits
        removed, added = changed_lines(text, new)
        assert len(added) == 1 and len(removed) <= 1, (text, removed, added)
        assert added[0].endswith(eol) or not new.endswith(added[0])
        assert getattr(parse(new, Path("h.yaml")).hosts[host], key) == value
        accepted += 1
    assert accepted > 150  # the mutations leave plenty of valid, editable files


def test_empty_host_entry_gets_its_first_key(tmp_path: Path) -> None:
    text = "defaults: {transport: local}\nhosts:\n  here:\n  there: {}\n"
    new = edit(text, "here", tmp_path, address="127.0.0.2")
    assert new == "defaults: {transport: local}\nhosts:\n  here:\n    address: 127.0.0.2\n  there: {}\n"
    new = edit(text, "there", tmp_path, address="127.0.0.3")
    assert new == "defaults: {transport: local}\nhosts:\n  here:\n  there: {address: 127.0.0.3}\n"


def test_block_scalar_is_refused_not_mangled(tmp_path: Path) -> None:
    text = f"hosts:\n  a:\n    address: 10.0.0.1\n    host_key: >-\n      {KEY}\n"
    assert parse(text, Path("h")).hosts["a"].host_key == KEY
    with pytest.raises(InventoryError, match="must be one line"):
        parse(text.replace(">-", ">"), Path("h"))  # a folded scalar keeps its final newline
    with pytest.raises(InventoryError) as info:
        edit(text, "a", tmp_path, host_key=KEY)
    assert str(info.value) == (
        f"{tmp_path}/hosts.yaml:4: hosts.a.host_key: block scalars ('|', '>') are not edited automatically")
