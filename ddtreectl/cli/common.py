"""Helpers shared by command modules: the inventory path and loading it once per command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ddtreectl.cli.app import OPTIONS

if TYPE_CHECKING:  # the models module is loaded with the inventory, not by every command's import
    from ddtreectl.inventory.models import Inventory, InventoryWarning


def inventory_path() -> Path:
    """--inventory/-i, then $DDTREECTL_INVENTORY, then ./hosts.yaml."""
    if OPTIONS.inventory is not None:
        return OPTIONS.inventory
    env = os.environ.get("DDTREECTL_INVENTORY")
    return Path(env) if env else Path("hosts.yaml")


def load_inventory() -> Inventory:
    """Load and validate the inventory selected by the global options."""
    from ddtreectl.errors import InventoryError
    from ddtreectl.inventory.loader import load

    path = inventory_path()
    try:
        inventory = load(path)
    except InventoryError as err:
        if not (OPTIONS.inventory_from_env and not path.exists()):
            raise
        raise InventoryError(f"{err.message} (from $DDTREECTL_INVENTORY)",
                             hint="fix or unset DDTREECTL_INVENTORY, or pass --inventory/-i PATH") from None
    warn_about(inventory)
    return inventory


def warn_about(inventory: Inventory) -> None:
    """The inventory's warnings on stderr (with --json too: stdout is the document), as `warning:` +
    `hint:` lines in the form of the errors (file:line: key path)."""
    print_warnings(inventory.warnings)


def print_warnings(warnings: tuple[InventoryWarning, ...]) -> None:
    import sys

    for warning in warnings:
        print(f"warning: {warning.message}\nhint: {warning.hint}", file=sys.stderr)
