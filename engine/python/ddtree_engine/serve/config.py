"""Server arguments: SGLang-style long flags, optionally from a `--config` YAML whose keys are the same
long names (`model-path: ...`, `tp-size: 8`, `speculative-ddtree-budget: 64`), as ddtreectl renders them.
Precedence: built-in defaults < YAML file < flags given on the command line."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence


class ConfigError(Exception):
    """A bad flag or config file; the message names the file and key."""


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    model_path: str = "random:0"
    served_model_name: str | None = None
    tp_size: int = 1
    device: str = "auto"
    speculative_algorithm: str | None = None
    speculative_ddtree_budget: int = 16
    speculative_block_size: int = 8  # drafter block incl. the root: L = block - 1 draft positions
    speculative_ddtree_topk: int | None = None
    speculative_draft_model_path: str | None = None
    # >0: train the built-in drafter on the target's own greedy outputs at load (seconds on a CPU).
    draft_distill_steps: int = 0
    max_running_requests: int = 4
    max_queued_requests: int = 16
    context_length: int = 2048
    default_max_tokens: int = 128
    load_delay: float = 0.0
    drain_timeout: float = 30.0
    allow_random_weights: bool = False
    random_seed: int = 0
    cuda_graph: bool = True
    cpu_threads: int = 1  # torch intra-op threads on CPU: the tiny model runs fastest on one
    enable_metrics: bool = True
    log_level: str = "info"
    # Multi-node keys ddtreectl renders; recorded and reported, the reference server runs on one device.
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None
    # Any other speculative-* key from the config (reported in /server_info, otherwise unused).
    speculative_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path

    @property
    def ddtree_enabled(self) -> bool:
        return (self.speculative_algorithm or "").upper() == "DDTREE"

    def server_info(self) -> dict[str, Any]:
        info = {k: v for k, v in dataclasses.asdict(self).items() if k != "speculative_extra"}
        info.update(self.speculative_extra)
        info["served_model_name"] = self.model_name
        return info


_BOOL_FIELDS = {f.name for f in dataclasses.fields(ServerConfig) if f.type in ("bool",)}
_INT_FIELDS = {f.name for f in dataclasses.fields(ServerConfig) if f.type in ("int", "int | None")}
_FLOAT_FIELDS = {f.name for f in dataclasses.fields(ServerConfig) if f.type == "float"}
_FIELDS = {f.name for f in dataclasses.fields(ServerConfig)} - {"speculative_extra"}
# Accepted for compatibility with SGLang configs; no effect on this server.
_IGNORED = {"trust_remote_code", "mem_fraction_static", "disable_radix_cache", "chunked_prefill_size",
            "attention_backend", "kv_cache_dtype", "dtype", "watchdog_timeout", "api_key"}
_ALIASES = {"ddtree_budget": "speculative_ddtree_budget", "tp": "tp_size", "max_total_requests": "max_queued_requests"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddtree_engine.serve",
                                description="OpenAI-compatible reference server over the DDTree engine.",
                                argument_default=argparse.SUPPRESS)
    p.add_argument("--config", help="YAML file of long-form server arguments (flags given here win)")
    for name in sorted(_FIELDS):
        flag = "--" + name.replace("_", "-")
        if name in _BOOL_FIELDS:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction)
        else:
            kind = int if name in _INT_FIELDS else float if name in _FLOAT_FIELDS else str
            p.add_argument(flag, dest=name, type=kind)
    p.add_argument("--ddtree-budget", dest="speculative_ddtree_budget", type=int, help="alias")
    p.add_argument("--tp", dest="tp_size", type=int, help="alias of --tp-size")
    return p


def _coerce(name: str, value: Any, where: str) -> Any:
    try:
        if value is None:
            return None
        if name in _BOOL_FIELDS:
            if isinstance(value, bool):
                return value
            raise TypeError
        if name in _INT_FIELDS:
            if isinstance(value, bool):
                raise TypeError
            return int(value)
        if name in _FLOAT_FIELDS:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {name.replace('_', '-')} has the wrong type ({value!r})") from None


def load_config(argv: Sequence[str] | None = None) -> ServerConfig:
    args = vars(_parser().parse_args(argv))
    cfg = ServerConfig()
    config_path = args.pop("config", None)
    if config_path:
        _apply_yaml(cfg, Path(config_path))
    for name, value in args.items():
        setattr(cfg, name, value)
    _validate(cfg)
    return cfg


def _apply_yaml(cfg: ServerConfig, path: Path) -> None:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if data is None:
        return
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of server arguments, got {type(data).__name__}")
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        key = _ALIASES.get(key, key)
        where = f"{path}: key {raw_key!r}"
        if key in _FIELDS:
            setattr(cfg, key, _coerce(key, value, where))
        elif key.startswith("speculative_"):
            cfg.speculative_extra[key] = value
        elif key not in _IGNORED:
            raise ConfigError(f"{where} is not a server argument (known: {', '.join(sorted(_FIELDS))})")


def _validate(cfg: ServerConfig) -> None:
    checks = [
        (1 <= cfg.port <= 65535, f"port {cfg.port} outside 1-65535"),
        (cfg.tp_size >= 1, "tp-size must be >= 1"),
        (cfg.cpu_threads >= 1, "cpu-threads must be >= 1"),
        (cfg.max_running_requests >= 1, "max-running-requests must be >= 1"),
        (cfg.max_queued_requests >= 1, "max-queued-requests must be >= 1"),
        (cfg.context_length >= 16, "context-length must be >= 16"),
        (cfg.speculative_ddtree_budget >= 0, "speculative-ddtree-budget must be >= 0"),
        (cfg.speculative_block_size >= 2, "speculative-block-size must be >= 2"),
        (cfg.load_delay >= 0, "load-delay must be >= 0"),
        (cfg.draft_distill_steps >= 0, "draft-distill-steps must be >= 0"),
        (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"), f"unknown device {cfg.device!r}"),
        (cfg.speculative_algorithm is None or cfg.speculative_algorithm.upper() in ("DDTREE", "NONE"),
         f"speculative-algorithm {cfg.speculative_algorithm!r} is not supported (DDTREE or none)"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(msg)
