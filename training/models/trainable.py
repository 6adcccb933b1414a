"""Which weights a phase trains: every weight, or only the top decoder layers (`TrainConfig.train_top_layers`).

Freezing everything below the top layers (embeddings, the output head tied to them, the lower layers) makes the
backward pass stop at the lowest trained layer: autograd keeps no activations and computes no gradients below it,
and the optimizer holds state for the trained weights only (smaller checkpoints). On a CPU that is most of a GRPO
step's cost (see docs/EXPERIMENTS.md section 10).
"""

from __future__ import annotations

from typing import Any

__all__ = ["decoder_layers", "train_top_layers", "trainable_parameters"]


def decoder_layers(model: Any) -> Any:
    """The model's stack of decoder layers (`model.get_decoder().layers`, as transformers' causal LMs have it)."""
    return _decoder(model).layers


def _decoder(model: Any) -> Any:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if getattr(decoder, "layers", None) is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers to choose from (model.get_decoder().layers): "
                         "train_top_layers works on transformers' causal LMs; set it to null")
    return decoder


def train_top_layers(model: Any, n: int) -> None:
    """Train only the top `n` decoder layers and the decoder's final norm; freeze every other weight.

    Raises ValueError when `n` is not between 1 and the model's number of layers.
    """
    decoder = _decoder(model)
    layers = decoder.layers
    if not 1 <= n <= len(layers):
        raise ValueError(f"train_top_layers={n}, but the model has {len(layers)} decoder layers: use 1 to "
                         f"{len(layers)}, or null to train every weight")
    model.requires_grad_(False)
    for layer in layers[len(layers) - n:]:
        layer.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)


def trainable_parameters(model: Any) -> int:
    """How many parameters the optimizer will update."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
