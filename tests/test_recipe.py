"""The GRPO recipe's defects fixed at their cause (issue 34, part 1), on the real tiny model and real TRL trainers:
top-layer training trains the output head (tied to the embedding) without backward reaching the frozen layers, the
learning-rate schedule of short runs, and what a capped turn or a truncated episode does in training and in eval."""

from __future__ import annotations

import copy
import os

import pytest
from training_helpers import small_train_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_cpu_thread")]
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


# ------------------------------------------------------------------------------------ top layers and the head
def _lm_step(model, tokenizer, optimizer=None):
    """One language-model loss backward pass (and optimizer step) on a short text; returns the loss."""
    import torch

    ids = torch.tensor([tokenizer("Question: how many singers are there? Tables: singer, concert")["input_ids"]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return loss


def _watch_lower_layer(model):
    """A hook on the bottom decoder layer's output: whether it required grad (a graph was built below the trained
    layers) and every gradient that reached it."""
    from training.models.trainable import decoder_layers

    built, seen = [], []

    def on_output(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        built.append(hidden.requires_grad)
        if hidden.requires_grad:
            hidden.register_hook(lambda grad: seen.append(grad))

    return built, seen, decoder_layers(model)[0].register_forward_hook(on_output)


def test_top_layer_training_trains_the_tied_head_from_the_output_side_only(tmp_path, tiny):
    """`train_top_layers=1` (head trained by default) on a real GRPO trainer: the optimizer holds the top layer, the
    final norm and the head, whose weight is the input embedding's; a step changes the head; no gradient reaches the
    layer below, with or without gradient checkpointing (which makes the embedding output require grad)."""
    import torch

    from training.grpo import build_trainer
    from training.models.trainable import decoder_layers

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # tied, as SmolLM2
    top = f"layers.{len(decoder_layers(model)) - 1}."
    head = "model.embed_tokens.weight"  # the tied head is listed once, under the embedding's name
    expected = {n for n, _ in model.named_parameters() if top in n or n in ("model.norm.weight", head)}
    trainer = build_trainer(small_train_config(tmp_path, train_top_layers=1, learning_rate=1e-2), model, tokenizer,
                            output_dir=str(tmp_path / "trainer"))
    names = {id(p): n for n, p in model.named_parameters()}
    optimizer = trainer.create_optimizer()
    assert {names[id(p)] for group in optimizer.param_groups for p in group["params"]} == expected

    built, seen, handle = _watch_lower_layer(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _lm_step(model, tokenizer, optimizer)
    assert built == [False] and seen == []  # no graph below the top layer, no gradient there
    assert {n for n, p in model.named_parameters() if p.grad is not None} == expected
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert head in changed and changed <= expected

    # The head's gradient is the output side's alone: that of an untied copy whose head alone trains. (A copy of
    # the fixture's model: the trainer's accelerator rebinds `model.forward`, which a deep copy would keep.)
    reference = copy.deepcopy(tiny[0])
    reference.load_state_dict(model.state_dict())
    reference.requires_grad_(False)
    reference.lm_head.weight = torch.nn.Parameter(model.get_output_embeddings().weight.detach().clone())
    model.zero_grad()
    _lm_step(model, tokenizer)
    _lm_step(reference, tokenizer)
    assert torch.allclose(model.get_output_embeddings().weight.grad, reference.lm_head.weight.grad, atol=1e-6)

    model.zero_grad()
    built.clear()
    model.gradient_checkpointing_enable()  # transformers then makes the embedding output require grad
    model.train()
    _lm_step(model, tokenizer)
    handle.remove()
    assert built == [True] and seen == []  # a graph below, but backward stops at the top layer's input
    assert model.get_output_embeddings().weight.grad is not None


def test_train_head_false_freezes_the_head(tmp_path, tiny):
    """`train_head=false`: the tied head/embedding stays frozen and unchanged; backward still stops above layer 0.
    Without train_top_layers the switch is refused (every weight trains then)."""
    import torch

    from training.config import ConfigError, TrainConfig
    from training.grpo import build_trainer

    model, tokenizer = copy.deepcopy(tiny[0]), tiny[1]
    trainer = build_trainer(small_train_config(tmp_path, train_top_layers=1, train_head=False, learning_rate=1e-2),
                            model, tokenizer, output_dir=str(tmp_path / "trainer"))
    optimizer = trainer.create_optimizer()
    head = model.get_output_embeddings().weight
    assert not head.requires_grad
    assert all(p is not head for group in optimizer.param_groups for p in group["params"])
    built, seen, handle = _watch_lower_layer(model)
    before = head.detach().clone()
    _lm_step(model, tokenizer, optimizer)
    handle.remove()
    assert built == [False] and seen == [] and head.grad is None and torch.equal(head.detach(), before)

    with pytest.raises(ConfigError, match="train_head=false"):
        TrainConfig(train_head=False)
    assert TrainConfig(train_top_layers=2, train_head=False).train_head is False
