"""Read probe fixtures (tests/probes/fixtures/): raw tool output, `#` comment lines stripped."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    """The fixture's text without its leading `#` provenance comments."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"
