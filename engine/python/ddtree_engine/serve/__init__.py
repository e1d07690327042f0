"""OpenAI-compatible reference server over the DDTree engine: `python -m ddtree_engine.serve --help`."""

from ddtree_engine.serve.config import ConfigError, ServerConfig, load_config

__all__ = ["ConfigError", "ServerConfig", "load_config", "main"]


def main(argv: list[str] | None = None) -> int:
    from ddtree_engine.serve.__main__ import main as _main

    return _main(argv)
