"""`ddtreectl trust` on a `transport: local` host: there is no host key; the refusal says so once."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.cli.main import run
from tests.cli.local_box import make_gpuless_box


@pytest.fixture
def box(tmp_path: Path) -> tuple[Path, Path]:
    return make_gpuless_box(tmp_path)


def test_trust_on_a_local_host_says_why_once_and_what_to_do(box: tuple[Path, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`trust box` on a `transport: local` host printed "error: box: box uses transport 'local': ..."
    (the name twice) and no hint."""
    inventory, _ = box
    assert run(["-i", str(inventory), "trust", "box", "--yes"]) == 2
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert first.startswith("error: box: transport 'local': ") and first.count("box") == 1, err
    assert "no host key to trust; nothing was recorded" in first, err
    assert "hint: nothing to do for box" in err and "`ddtreectl trust box`" in err, err
