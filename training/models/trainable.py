"""Which weights a phase trains: every weight, or only the top decoder layers (`TrainConfig.train_top_layers`) and,
by default, the output head (`TrainConfig.train_head`).

Freezing everything below the top layers makes the backward pass stop at the lowest trained layer: autograd keeps no
activations and computes no gradients below it, and the optimizer holds state for the trained weights only (smaller
checkpoints). On a CPU that is most of a GRPO step's cost (see docs/EXPERIMENTS.md section 10).

The output head trains with the top layers unless asked not to. It carries most of a small model's policy-gradient
signal: on the tiny model at SmolLM2's batch shape, the head held 266 of 378 of the gradient norm, and 16 GRPO steps of
the top layer alone moved greedy success 0% -> 0% where the top layer plus the head moved it 0% -> 49% (issue 34).

SmolLM2 and the tiny model tie the head to the input embedding (one weight). Letting that weight require grad would
make autograd reach it through its other use too, the embedding lookup at the bottom of the network, and so backward
through every frozen layer. So when the trained head is tied, the embedding's output is detached (a forward hook on
the embedding module): the head gets its gradient from the output side only, and the frozen layers below build no
graph. A forward pre-hook on the lowest trained layer detaches its input as well, so backward stops there even when
something else makes the embedding output require grad (transformers' `enable_input_require_grads`, which gradient
checkpointing turns on). The tied weight still serves both uses, so an update of the head moves the embedding too:
that is what tying means.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["decoder_layers", "train_top_layers", "trainable_parameters"]

#: The detaching hooks a model carries (by module), so that choosing again replaces them instead of adding more.
_HOOKS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def decoder_layers(model: Any) -> Any:
    """The model's stack of decoder layers (`model.get_decoder().layers`, as transformers' causal LMs have it)."""
    return _decoder(model).layers


def _decoder(model: Any) -> Any:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if getattr(decoder, "layers", None) is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers to choose from (model.get_decoder().layers): "
                         "train_top_layers works on transformers' causal LMs; set it to null")
    return decoder


def train_top_layers(model: Any, n: int, *, train_head: bool = True) -> None:
    """Train only the top `n` decoder layers, the decoder's final norm and (with `train_head`) the output head; freeze
    every other weight. Backward stops at the lowest trained layer (see the module docstring).

    Args:
        model: a transformers causal LM (`get_decoder().layers`, `get_output_embeddings()`).
        n: how many decoder layers, counted from the top, train.
        train_head: train the output head too (default True). When the head is tied to the input embedding, it
            learns from the output side only: the embedding lookup's output is detached. False freezes it.

    Raises ValueError when `n` is not between 1 and the model's number of layers, or the model has no output head
    to train.
    """
    decoder = _decoder(model)
    layers = decoder.layers
    if not 1 <= n <= len(layers):
        raise ValueError(f"train_top_layers={n}, but the model has {len(layers)} decoder layers: use 1 to "
                         f"{len(layers)}, or null to train every weight")
    _remove_hooks(model)
    model.requires_grad_(False)
    lowest = layers[len(layers) - n]
    for layer in layers[len(layers) - n:]:
        layer.requires_grad_(True)
    norm = getattr(decoder, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)
    if n < len(layers):
        _HOOKS[lowest] = lowest.register_forward_pre_hook(_detach_hidden_states, with_kwargs=True)
    if not train_head:
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "weight", None) is None:
        raise ValueError(f"{type(model).__name__} has no output head (get_output_embeddings()) to train: set "
                         "train_head=false")
    head.requires_grad_(True)
    embedding = model.get_input_embeddings()
    if embedding is not None and getattr(embedding, "weight", None) is head.weight:  # tied: one weight, two uses
        _HOOKS[embedding] = embedding.register_forward_hook(_detach_output)


def _remove_hooks(model: Any) -> None:
    for module in model.modules():
        handle = _HOOKS.pop(module, None)
        if handle is not None:
            handle.remove()


def _detach_output(module: Any, args: Any, output: Any) -> Any:
    """The embedding lookup's output, cut from the graph: its tied weight trains as the head only."""
    return output.detach()


def _detach_hidden_states(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The lowest trained layer's input hidden states, cut from the graph: backward stops at this layer."""
    if args:
        return (args[0].detach(),) + tuple(args[1:]), kwargs
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach()}
    return args, kwargs


def trainable_parameters(model: Any) -> int:
    """How many parameters the optimizer will update."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
