"""Which templates render a host's unit when the inventory lives outside the checkout (`-i PATH`).

The engine fell back to the one bundled with this checkout, the templates did not: `render`, `status`,
`restore-service` and `deploy` failed with "template not found in <inventory dir>/templates" and a hint
that did not say what to do. Now the templates follow the engine's rule (beside the inventory, else
bundled), and a template missing from a `templates/` beside the inventory names the file to copy."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.cli.main import run
from ddtreectl.errors import TemplateError
from ddtreectl.inventory.loader import load
from ddtreectl.render.units import BUNDLED_TEMPLATES, render_service, templates_dir_for

REPO = Path(__file__).resolve().parents[2]
INVENTORY = """services:
  svc:
    template: sglang-ddtree.service.j2
    port: 30000
    model_path: /models/x
    served_model_name: x
hosts:
  h1:
    address: 127.0.0.1
    gpus: 0
    service: svc
"""


def outside(tmp_path: Path) -> Path:
    inventory = tmp_path / "fleet" / "hosts.yaml"
    inventory.parent.mkdir()
    inventory.write_text(INVENTORY)
    return inventory


def test_an_inventory_outside_the_checkout_renders_with_the_bundled_templates(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert BUNDLED_TEMPLATES == REPO / "templates"
    inv = load(outside(tmp_path))
    assert templates_dir_for(inv) == BUNDLED_TEMPLATES
    rendered = render_service(inv, inv.host("h1"))
    assert rendered is not None
    assert rendered.files == render_service(inv, inv.host("h1"), BUNDLED_TEMPLATES).files  # type: ignore[union-attr]
    assert [f.path.rsplit("/", 1)[-1] for f in rendered.files] == ["svc.service", "svc.yaml"]
    assert run(["-i", str(inv.path), "render", "h1"]) == 0
    assert "ExecStart=" in capsys.readouterr().out


def test_templates_beside_the_inventory_win_whole(tmp_path: Path) -> None:
    inventory = outside(tmp_path)
    beside = inventory.parent / "templates"
    beside.mkdir()
    (beside / "sglang-ddtree.service.j2").write_text("# own template for {{ host.name }}\n[Service]\n"
                                                     "ExecStart={{ exec_start }}\n")
    inv = load(inventory)
    rendered = render_service(inv, inv.host("h1"))
    assert rendered is not None and templates_dir_for(inv) == beside
    assert rendered.unit_file.content.startswith("# own template for h1\n")
    assert len(rendered.files) == 1  # no config template there: the bundled one is not mixed in


def test_a_template_missing_beside_the_inventory_says_what_to_copy_where(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inventory = outside(tmp_path)
    beside = inventory.parent / "templates"
    beside.mkdir()
    (beside / "other.service.j2").write_text("[Service]\n")
    inv = load(inventory)
    with pytest.raises(TemplateError) as caught:
        render_service(inv, inv.host("h1"))
    err = caught.value
    assert err.message == f"template 'sglang-ddtree.service.j2' not found in {beside}"
    assert err.hint is not None
    assert f"`cp {BUNDLED_TEMPLATES / 'sglang-ddtree.service.j2'} {beside}/`" in err.hint, err.hint
    assert "services.svc.template" in err.hint
    assert run(["-i", str(inventory), "render", "h1"]) == 3
    assert f"cp {BUNDLED_TEMPLATES / 'sglang-ddtree.service.j2'} {beside}/" in capsys.readouterr().err


def test_a_template_name_that_exists_nowhere_lists_what_the_directory_has(tmp_path: Path) -> None:
    inventory = outside(tmp_path)
    inventory.write_text(INVENTORY.replace("sglang-ddtree.service.j2", "sglang-ddtre.service.j2"))
    inv = load(inventory)
    with pytest.raises(TemplateError) as caught:
        render_service(inv, inv.host("h1"))
    assert caught.value.hint == (f"services.svc.template names a file under {BUNDLED_TEMPLATES} "
                                 "(there: sglang-ddtree.service.j2)")
