"""The `build:` mapping (deploy's CUDA archs and CMake arguments): defaults, per-host override, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtreectl.errors import InventoryError
from ddtreectl.inventory.loader import parse
from ddtreectl.inventory.models import BuildSettings


def load(text: str) -> dict[str, BuildSettings]:
    inv = parse(text, Path("hosts.yaml"))
    return {name: h.build for name, h in inv.hosts.items()}


def test_build_defaults_and_host_override() -> None:
    builds = load("defaults:\n  build:\n    cuda_archs: [90]\n    cmake_args: [-DDDTREE_OPS=draft_topk_lse]\n"
                  "hosts:\n  a: {address: 10.0.0.1}\n"
                  "  b:\n    address: 10.0.0.2\n    build: {cuda_archs: ['120a', 90]}\n"
                  "  c: {transport: local}\n")
    assert builds["a"] == BuildSettings(("90",), ("-DDDTREE_OPS=draft_topk_lse",))
    # A host's build replaces the default one as a whole.
    assert builds["b"] == BuildSettings(("120a", "90"), ())
    assert builds["c"] == builds["a"]


def test_no_build_section_means_engine_defaults() -> None:
    assert load("hosts:\n  a: {address: 10.0.0.1}\n")["a"] == BuildSettings()


@pytest.mark.parametrize("build,message", [
    ("{cuda_archs: [sm_90]}", "hosts.a.build.cuda_archs[0]: 'sm_90' is not a CUDA architecture"),
    ("{cuda_archs: 90}", "hosts.a.build.cuda_archs: expected a list"),
    ("{cmake_args: ['-G Ninja']}", "'-G Ninja' is not a CMake cache definition"),
    ("{cmake_args: [-DDDTREE_CUDA_ARCHS=90]}", "use build.cuda_archs instead"),
    ("{cmake_args: [\"-DX=a\\nb\"]}", "is not a CMake cache definition"),
    ("{cuda_arch: [90]}", "unknown key 'cuda_arch' (did you mean 'cuda_archs'?)"),
    ("[90]", "hosts.a.build"),
])
def test_bad_build_settings_name_the_key_and_line(build: str, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        load(f"hosts:\n  a:\n    address: 10.0.0.1\n    build: {build}\n")
    text = str(err.value) + (err.value.hint or "")
    assert message in text
    assert "hosts.yaml:4" in text
