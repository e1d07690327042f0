"""Shared inputs of the inventory loader tests: a good inventory and helpers that load a bad one."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from ddtreectl.errors import ExitCode, InventoryError
from ddtreectl.inventory.loader import load

GOOD = """\
defaults:
  user: deploy
  port: 2222
  identity_file: ~/.ssh/fleet
  connect_timeout: 3
services:
  svc:
    template: sglang-ddtree.service.j2
    port: 30000
    model_path: /models/m
    served_model_name: m
hosts:
  gpu1:
    address: 10.0.0.5
    gpus: 8
    role: prod
    service: svc
  gpu2:
    address: gpu2.example.com
    port: 22
    user: root
    jump_host: gpu1
  here:
    transport: local
    remote_root: ~/ddtree
groups:
  prod: [gpu1]
  all-gpu: [gpu1, gpu2]
"""


def write(tmp_path: Path, text: str, name: str = "hosts.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path: Path, text: str) -> InventoryError:
    path = write(tmp_path, text)
    os.chdir(tmp_path)  # the message names the file as given: use a relative path
    with pytest.raises(InventoryError) as info:
        load(Path(path.name))
    assert info.value.exit_code == ExitCode.INVENTORY == 3
    return info.value
