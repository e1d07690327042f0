"""Saving and loading a TinyTransformer's config and weights (safetensors when installed, else torch.save)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from ddtree_engine.model import ModelConfig, expected_weight_names


def save_model(path: str | Path, cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> Path:
    """`*.safetensors` (needs the safetensors package) or anything else via torch.save."""
    path = Path(path)
    tensors = {k: v.detach().to(torch.float32).contiguous().cpu() for k, v in weights.items()}
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file  # optional dependency

        save_file(tensors, str(path), metadata={"ddtree_config": json.dumps(asdict(cfg))})
    else:
        torch.save({"format": "ddtree-tiny-v1", "config": asdict(cfg), "weights": tensors}, path)
    return path


def load_model(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """Load what save_model wrote. A directory is searched for model.safetensors, then model.pt."""
    path = Path(path)
    if path.is_dir():
        for name in ("model.safetensors", "model.pt"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            raise FileNotFoundError(f"{path}: no model.safetensors or model.pt in this directory")
    if path.suffix == ".safetensors":
        try:
            from safetensors import safe_open
        except ImportError as e:
            raise RuntimeError(f"{path}: loading .safetensors needs `pip install safetensors`") from e
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if "ddtree_config" not in meta:
                raise ValueError(f"{path}: no ddtree_config in the safetensors metadata")
            cfg = ModelConfig(**json.loads(meta["ddtree_config"]))
            weights = {k: f.get_tensor(k) for k in f.keys()}
    else:
        blob = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(blob, dict) or blob.get("format") != "ddtree-tiny-v1":
            raise ValueError(f"{path}: not a ddtree tiny-model file (format key missing)")
        cfg = ModelConfig(**blob["config"])
        weights = blob["weights"]
    missing = expected_weight_names(cfg) - set(weights)
    if missing:
        raise ValueError(f"{path}: missing weights {sorted(missing)[:5]}")
    return cfg, weights
